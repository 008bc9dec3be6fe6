"""Conversion throughput and memory against the physical limit (``cp -r`` of the same files), in one run.

A Qwen3-0.6B-shaped bf16 checkpoint (28 layers, hidden 1024, 16 heads / 8 KV heads of 128,
MLP 3072, vocabulary 151936, tied embeddings: ~0.6 B parameters, ~1.2 GB) is generated as
random tensors written straight into safetensors shards (no transformers model is built).
Then, alternating and repeated: ``cp -r`` of the checkpoint, and ``ascend-patch convert``
hf -> mg at TP1/PP1 and TP2/PP2, hf -> torch_dist and torch_dist -> hf (Megatron-LM's default
format, written and read without a model), each in a child process whose peak RSS is taken
from wait4().
Goals: throughput >= 0.5x the copy's, peak RSS <= 25% of the model's size.

    PYTHONPATH=. python benchmarks/convert.py [--repeats 7] [--keep]

Everything lives in a temporary directory under /tmp, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": True,
    "attention_bias": False, "dtype": "bfloat16",
}
SHARD_BYTES = 400 * 1024 * 1024


def _tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, ng = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (nh * d, h)),
                (p + "self_attn.k_proj.weight", (ng * d, h)), (p + "self_attn.v_proj.weight", (ng * d, h)),
                (p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,)),
                (p + "self_attn.o_proj.weight", (h, nh * d)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                (p + "mlp.down_proj.weight", (h, f))]
    return out + [("model.norm.weight", (h,))]


def generate(path: str) -> int:
    """Random bf16 tensors written shard by shard (one shard in memory at a time); returns total bytes."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path)
    specs = _tensors(CONFIG)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for key, shape in specs:
        n = 2
        for s in shape:
            n *= s
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((key, shape))
        size += n
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {key: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16) for key, shape in shard}
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update({key: name for key in tensors})
        del tensors
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    return total


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, files in os.walk(path) for n in files)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes of the child from wait4, its stdout) for one command."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode()[-2000:]}")
        return seconds, usage.ru_maxrss * 1024, out.read().decode()


def _write_phase(stdout: str) -> float | None:
    """The converter's own figure for the streaming phase ("wrote N file(s), X MB in Y s")."""
    m = re.search(r"wrote \d+ file\(s\), [\d.]+ MB in ([\d.]+) s", stdout)
    return float(m.group(1)) if m else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--generate-into", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_into:
        print(generate(args.generate_into))
        return 0

    model_bytes = sum(2 * __import__("math").prod(s) for _, s in _tensors(CONFIG))
    free = shutil.disk_usage("/tmp").free
    needed = int(model_bytes * 4.5)  # source, one output, the torch_dist source, the copy's page cache slack
    if free < needed:
        print(f"need {needed / 1e9:.1f} GB free in /tmp, have {free / 1e9:.1f} GB", file=sys.stderr)
        return 1
    root = tempfile.mkdtemp(prefix="ascend_patch-bench-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}  # as a user runs it
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    try:
        src = os.path.join(root, "hf")
        t0 = time.perf_counter()
        # In a child: this process must stay small, since a child's peak RSS counts the parent's at fork.
        gen = subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-into", src], env=env,
                             capture_output=True, text=True)
        if gen.returncode != 0:
            raise SystemExit(f"generating the checkpoint failed: {gen.stderr[-2000:]}")
        total = int(gen.stdout.strip().splitlines()[-1])
        print(f"generated {len(_tensors(CONFIG))} tensors, {total / 1e9:.3f} GB bf16 "
              f"({total / 2 / 1e9:.3f} B parameters) in {time.perf_counter() - t0:.1f} s")
        floor_s, floor_rss, _ = timed([sys.executable, "-c", "import ascend_patch.cli, ascend_patch.loaders.engine, "
                                    "ascend_patch.loaders.hf, ascend_patch.loaders.megatron, safetensors, tqdm"], env)
        torch_s, torch_rss, _ = timed([sys.executable, "-c", "import torch"], env)
        runs: dict[str, list[tuple[float, int, int, float | None]]] = {
            "cp -r": [], "hf->mg TP1/PP1": [], "hf->mg TP2/PP2": [], "hf->torch_dist": [], "torch_dist->hf": []}
        layouts = {"hf->mg TP1/PP1": ("1", "1"), "hf->mg TP2/PP2": ("2", "2")}
        # the torch_dist source of "torch_dist->hf": this converter's own output (one chunk per layer and tensor)
        dist = os.path.join(root, "dist")
        timed([sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf", "--save-model-type",
               "mg", "--ckpt-format", "torch_dist", "--load-dir", src, "--save-dir", dist, "--no-progress"], env)
        for _ in range(args.repeats):
            for name in runs:
                dst = os.path.join(root, "out")
                if name == "cp -r":
                    cmd = ["cp", "-r", src, dst]
                elif name == "hf->torch_dist":
                    cmd = [sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf",
                           "--save-model-type", "mg", "--ckpt-format", "torch_dist", "--load-dir", src,
                           "--save-dir", dst, "--no-progress"]
                elif name == "torch_dist->hf":
                    cmd = [sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "mg",
                           "--save-model-type", "hf", "--load-dir", dist, "--save-dir", dst, "--no-progress"]
                else:
                    tp, pp = layouts[name]
                    cmd = [sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf",
                           "--save-model-type", "mg", "--model-type-hf", "qwen3", "--load-dir", src,
                           "--save-dir", dst, "--target-tensor-parallel-size", tp,
                           "--target-pipeline-parallel-size", pp, "--no-progress"]
                os.sync()  # every run starts with no dirty pages left by the previous one (writeback would throttle it)
                seconds, rss, stdout = timed(cmd, env)
                written = _du(dst)
                shutil.rmtree(dst)
                runs[name].append((seconds, rss, written, _write_phase(stdout)))
        print(f"\ninterpreter floor (python + the converter's imports, no torch): peak RSS {floor_rss / 1e6:.0f} MB, "
              f"{floor_s:.2f} s; for scale, `import torch` alone: {torch_rss / 1e6:.0f} MB, {torch_s:.2f} s")
        print(f"{'run':<16} {'written GB':>10} {'best s':>7} {'x cp':>5} {'median s':>9} {'x cp':>5} "
              f"{'stream s':>9} {'x cp':>5} {'peak RSS MB':>12} {'RSS/model':>10}")
        cp_best = cp_median = None
        for name, samples in runs.items():
            times = [s for s, _, _, _ in samples]
            best, median = min(times), statistics.median(times)
            rss = max(r for _, r, _, _ in samples)
            written = samples[0][2]
            phases = [p for *_, p in samples if p is not None]
            stream = min(phases) if phases else best
            cp_best = cp_best or written / best
            cp_median = cp_median or written / median
            print(f"{name:<16} {written / 1e9:>10.3f} {best:>7.2f} {written / best / cp_best:>5.2f} {median:>9.2f} "
                  f"{written / median / cp_median:>5.2f} {stream:>9.2f} {written / stream / cp_best:>5.2f} "
                  f"{rss / 1e6:>12.0f} {rss / model_bytes:>9.1%}")
        print("\n'x cp' is throughput (bytes written per second) over the copy's. 'best' and 'median' are over the "
              f"{args.repeats} alternating runs of each (a shared virtual machine only ever slows a run down, so the "
              "best is the least disturbed); end to end includes interpreter start, imports, plugin discovery and "
              "preflight. 'stream s' is the converter's own figure for its streaming phase (best run).")
        print(f"\nmodel size {model_bytes / 1e9:.3f} GB; goals: >= 0.50x cp throughput, peak RSS <= 25% of model size "
              f"({0.25 * model_bytes / 1e6:.0f} MB)")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
