"""``ascend-patch demo``: the whole path a user walks, on a tiny model, in a few minutes.

1. make a tiny Qwen3 Hugging Face checkpoint (random weights, byte-level tokenizer; local);
2. ``ascend-patch check`` the planned launch (ranks, groups, model vs parallel sizes);
3. convert it to Megatron at TP x PP (and back once, untrained: the round trip is exact);
4. train with ``examples/pretrain_gpt.py`` (stock megatron-core, written for CUDA) under
   ``torchrun -m ascend_patch`` on the shipped corpus, saving a Megatron checkpoint;
5. convert the trained checkpoint back to Hugging Face;
6. load it with transformers and generate a few tokens.

Each stage prints what it runs, how long it took, and its result; the summary at the end
collects them. Artefacts go to ``--workdir`` (kept) or a temporary directory (removed
unless ``--keep``, or unless a stage failed, so the evidence stays).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import AscendPatchError

__all__ = ["DemoResult", "DemoError", "run_demo"]

MARK = ".ascend-patch-demo"
PROMPT = "three plus four is"
SEQ = 64  # training sequence length (positions beyond it were never trained)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "pretrain_gpt.py")


class DemoError(AscendPatchError, RuntimeError):
    """A stage failed; the message says which and where its log is."""


@dataclass
class DemoResult:
    workdir: str
    timings: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    round_trip_tensors: int = 0
    generated: str = ""
    hf_loss: float = float("nan")
    kept: bool = True

    @property
    def loss_fell(self) -> bool:
        return len(self.losses) >= 2 and self.losses[-1] < self.losses[0]


def _say(text: str = "") -> None:
    print(text, flush=True)


def _stage(result: DemoResult, number: int, title: str, work: Callable[[], str]) -> None:
    _say(f"\n[{number}/6] {title}")
    start = time.perf_counter()
    try:
        outcome = work()
    except (DemoError, subprocess.CalledProcessError, OSError) as exc:
        raise DemoError(f"[{number}/6] {title} failed: {exc}\nthe artefacts are kept in {result.workdir} "
                        f"(logs in {os.path.join(result.workdir, 'logs')})") from exc
    elapsed = time.perf_counter() - start
    result.timings[title] = elapsed
    _say(f"      -> {outcome}  ({elapsed:.1f} s)")


def _run(cmd: list[str], log: str, env: dict[str, str] | None = None, show: Callable[[str], bool] | None = None,
         cwd: str | None = None) -> None:
    """Run ``cmd``; lines of its stdout that ``show`` accepts are echoed; everything goes to ``log``."""
    _say("      $ " + " ".join(cmd))
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=cwd)
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            if show is not None and show(line):
                _say("      " + line.rstrip())
        code = proc.wait()
    if code != 0:
        with open(log) as f:
            tail = "".join(f.readlines()[-30:])
        raise DemoError(f"{' '.join(cmd[:4])} ... exited with {code}; the last lines of {log}:\n{tail}")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ascend_patch.cli", *args]


def _child_env(device: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["ASCEND_PATCH_DEVICE"] = device
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _prepare_workdir(workdir: str | None) -> tuple[str, bool]:
    """(directory, made by us). An existing non-empty directory must be an earlier demo's."""
    if workdir is None:
        path = tempfile.mkdtemp(prefix="ascend-patch-demo-")
        open(os.path.join(path, MARK), "w").close()
        return path, True
    path = os.path.abspath(workdir)
    if os.path.isdir(path) and os.listdir(path):
        if not os.path.exists(os.path.join(path, MARK)):
            raise DemoError(f"--workdir {path} is not empty and was not made by ascend-patch demo; "
                            "give an empty or new directory")
        for entry in os.listdir(path):  # an earlier demo's artefacts: start afresh
            full = os.path.join(path, entry)
            if entry != MARK:
                shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, MARK), "w").close()
    return path, False


def _sparkline(values: list[float], width: int = 40) -> str:
    bars = "▁▂▃▄▅▆▇█"
    if len(values) > width:  # the mean of each of `width` consecutive runs
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(bars[min(len(bars) - 1, int((v - lo) / span * (len(bars) - 1) + 0.5))] for v in values)


def _compare_tensors(a_dir: str, b_dir: str) -> int:
    """How many tensors two HF checkpoints share, bit for bit; raises on any difference."""
    import torch
    from safetensors import safe_open

    def tensors(path: str) -> dict[str, Any]:
        out = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(path, name), "pt") as f:
                    out.update({k: f.get_tensor(k) for k in f.keys()})
        return out

    a, b = tensors(a_dir), tensors(b_dir)
    if set(a) != set(b):
        raise DemoError(f"round trip changed the tensor names: {sorted(set(a) ^ set(b))[:5]}")
    for key in a:
        if a[key].dtype != b[key].dtype or not torch.equal(a[key], b[key]):
            raise DemoError(f"round trip changed {key}")
    return len(a)


def run_demo(workdir: str | None = None, keep: bool = False, device: str = "cpu", nproc: int = 4, tp: int = 2,
             pp: int = 2, steps: int = 150) -> DemoResult:
    """Run the six stages; returns what they produced. Raises DemoError naming the failed stage."""
    if nproc % (tp * pp):
        raise DemoError(f"--nproc {nproc} is not a multiple of --tp {tp} x --pp {pp}")
    if steps < 1:
        raise DemoError(f"--steps {steps}: train at least 1 step")
    if not os.path.exists(EXAMPLE):
        raise DemoError(f"the demo trains with {EXAMPLE}, which is not here: run it from a clone of the "
                        "ascend_patch repository (pip install -e .)")
    if device == "auto":  # one concrete target for every stage (check names it, workers use it)
        from ..backend import probe_npu

        device = "npu" if probe_npu()[0] else "cpu"
    path, temporary = _prepare_workdir(workdir)
    result = DemoResult(path)
    hf, mg, trained, back, check = (os.path.join(path, d) for d in ("hf", "mg", "trained", "hf-trained", "hf-check"))
    logs = os.path.join(path, "logs")
    os.makedirs(logs, exist_ok=True)
    env = _child_env(device)
    dp = nproc // (tp * pp)
    _say(f"ascend-patch demo: a tiny Qwen3 on the {device} target, {nproc} workers (TP={tp} x PP={pp} x DP={dp}), "
         f"{steps} training steps\nartefacts: {path}")
    ok = False
    try:
        from .tiny_model import make_tiny_qwen3

        def make() -> str:
            cfg = make_tiny_qwen3(hf)
            return (f"{hf}: Qwen3, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
                    f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, "
                    f"vocab {cfg['vocab_size']} (bytes), tied embeddings")

        _stage(result, 1, "make a tiny Hugging Face checkpoint", make)

        model_argv: list[str] = []

        def check_layout() -> str:
            model_argv.extend(subprocess.run(_cli("args", "--hf-config", hf, "--format", "argv"), env=env,
                                             capture_output=True, text=True, check=True).stdout.split())
            _run(_cli("check", "--world-size", str(nproc), "--tp", str(tp), "--pp", str(pp), "--hf-config", hf,
                      "--device", device, "--megatron-args=" + " ".join(model_argv)),
                 os.path.join(logs, "check.log"), env, show=lambda line: True)
            return "no errors: the layout fits the model"

        _stage(result, 2, "check the planned launch", check_layout)

        def to_megatron() -> str:
            _run(_cli("convert", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
                      "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp),
                      "--load-dir", hf, "--save-dir", mg, "--params-dtype", "fp32", "--verify"),
                 os.path.join(logs, "convert-hf-mg.log"), env, show=lambda line: "verif" in line.lower())
            _run(_cli("convert", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf", "qwen3",
                      "--load-dir", mg, "--save-dir", check), os.path.join(logs, "convert-roundtrip.log"), env)
            result.round_trip_tensors = _compare_tensors(hf, check)
            ranks = sorted(os.listdir(os.path.join(mg, sorted(d for d in os.listdir(mg) if d.startswith("iter"))[0])))
            return (f"{mg}: {len(ranks)} rank files ({', '.join(ranks)}); converting back gives all "
                    f"{result.round_trip_tensors} tensors bit-identical")

        _stage(result, 3, f"convert to Megatron (TP={tp}, PP={pp})", to_megatron)

        def train() -> str:
            loss_log = os.path.join(logs, "losses.jsonl")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-port", str(_free_port()), "-m", "ascend_patch", EXAMPLE, "--spec", "qwen3",
                   *model_argv, "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
                   "--load", mg, "--finetune", "--save", trained, "--save-interval", str(steps),
                   "--train-iters", str(steps), "--seq-length", str(SEQ), "--micro-batch-size", "2",
                   "--global-batch-size", str(8 * dp), "--lr", "3e-3", "--lr-warmup-iters", str(min(5, steps - 1)),
                   "--lr-decay-style", "cosine", "--min-lr", "3e-4",
                   "--hidden-dropout", "0", "--attention-dropout", "0", "--loss-log", loss_log,
                   "--log-interval", str(max(1, steps // 8))]
            _run(cmd, os.path.join(logs, "train.log"), env, show=lambda line: "iteration" in line, cwd=path)
            with open(loss_log) as f:
                result.losses = [json.loads(line)["loss"] for line in f]
            if not result.loss_fell:
                raise DemoError(f"the loss did not fall: {result.losses}")
            return (f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}  {_sparkline(result.losses)}; "
                    f"checkpoint {trained}")

        _stage(result, 4, f"train with megatron-core under torchrun ({nproc} workers)", train)

        def to_hf() -> str:
            _run(_cli("convert", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf", "qwen3",
                      "--load-dir", trained, "--save-dir", back, "--true-vocab-size", "256"),
                 os.path.join(logs, "convert-mg-hf.log"), env)
            for name in os.listdir(hf):  # tokenizer files are not part of a Megatron checkpoint
                if name.startswith(("tokenizer", "special_tokens")):
                    shutil.copy(os.path.join(hf, name), back)
            return f"{back}: " + ", ".join(sorted(n for n in os.listdir(back) if not n.startswith("tokenizer")))

        _stage(result, 5, "convert the trained checkpoint back to Hugging Face", to_hf)

        def generate() -> str:
            import torch
            import transformers

            transformers.utils.logging.disable_progress_bar()
            tokenizer = transformers.AutoTokenizer.from_pretrained(back)
            model = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
            sys.path.insert(0, os.path.dirname(EXAMPLE))
            try:
                from gpt_data import generate_corpus
            finally:
                sys.path.remove(os.path.dirname(EXAMPLE))
            text = generate_corpus(4096, seed=99)  # text the model did not train on
            batch = tokenizer(text, return_tensors="pt").input_ids[0, :SEQ * 16].view(16, SEQ)
            with torch.no_grad():
                result.hf_loss = float(model(batch, labels=batch).loss)
                ids = tokenizer(PROMPT, return_tensors="pt").input_ids
                out = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            result.generated = tokenizer.decode(out[0][ids.shape[1]:])
            return (f"transformers' loss on unseen corpus text: {result.hf_loss:.3f} (random init: ln 256 = 5.545); "
                    f"{PROMPT!r} -> {result.generated!r}")

        _stage(result, 6, "load it with transformers and generate", generate)
        ok = True
    finally:
        result.kept = (not temporary) or keep or not ok
        if not result.kept:
            shutil.rmtree(path, ignore_errors=True)
    _summary(result)
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(result: DemoResult) -> None:
    _say("\nsummary")
    for title, seconds in result.timings.items():
        _say(f"  {seconds:6.1f} s  {title}")
    _say(f"  {sum(result.timings.values()):6.1f} s  total")
    if result.losses:
        every = max(1, len(result.losses) // 10)
        points = " ".join(f"{x:.2f}" for x in result.losses[::every])
        _say(f"  loss: {result.losses[0]:.3f} -> {result.losses[-1]:.3f}  {_sparkline(result.losses)}")
        _say(f"        every {every} step(s): {points}")
    _say(f"  round trip hf -> mg -> hf: {result.round_trip_tensors} tensors bit-identical")
    _say(f"  transformers' loss on unseen text: {result.hf_loss:.3f}")
    _say(f"  generated: {PROMPT!r} -> {result.generated!r}")
    _say(f"  artefacts: {result.workdir}" + ("" if result.kept else " (removed; --keep keeps them)"))


def _cmd(args: argparse.Namespace) -> int:
    try:
        run_demo(args.workdir, args.keep, args.device, args.nproc, args.tp, args.pp, args.steps)
    except DemoError as exc:
        print(f"ascend-patch demo failed: {exc}", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the whole path on a tiny model: make, check, convert, train, convert back, "
                                    "generate")
    p.add_argument("--workdir", help="where the artefacts go (kept); default: a temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--device", choices=("auto", "npu", "cpu"), default="auto",
                   help="target for training (default auto: npu when there is one, else cpu)")
    p.add_argument("--nproc", type=int, default=4, help="training workers (default 4)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--pp", type=int, default=2, help="pipeline-parallel size (default 2)")
    p.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    p.set_defaults(func=_cmd)
