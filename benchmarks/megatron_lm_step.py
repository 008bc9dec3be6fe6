"""Time per iteration of Megatron-LM's own pretrain_gpt.py on the cpu target, side by side in one run.

Modes, each launched with torchrun in processes of its own, alternating, several times:

* ``ascend_patch:<impl>``: ``torchrun -m ascend_patch pretrain_gpt.py --transformer-impl <impl> ...``,
  the launch line unchanged (every patch of every plugin active). ``--impls`` lists the
  ``--transformer-impl`` values to compare (default ``local,transformer_engine``); an impl that
  cannot run here (e.g. ``transformer_engine`` before the Transformer-Engine-compatible layer
  exists) is reported with the reason and left out of the ratios.
* ``by_hand``: the same script with ``--transformer-impl local`` made to run on the host by the
  minimum set of monkeypatches a user would write by hand, applied before runpy runs it
  (:func:`patch_by_hand`, found by running it until it stopped failing), with ``gloo`` asked for
  on the command line, plus what makes the comparison fair: where megatron would take a fused
  path on a GPU (its compiled bias-GeLU, FusedAdam, apex's multi-tensor ops) the by-hand port
  takes torch's fused op for it, as ascend_patch does (:func:`use_the_fused_paths_megatron_picks`;
  without it megatron-core runs its eager fallbacks and the by-hand port was 16-52 % slower than
  ascend_patch, which measured the fallbacks, not the patch layer).

The figure per mode is the median of Megatron's own ``elapsed time per iteration (ms)`` over
the timed iterations of all its processes (``--log-interval 1``; the first ``--warmup``
iterations of each process are left out). Every mode runs megatron's jit functions eagerly
(ascend_patch's choice on cpu; ``TORCHDYNAMO_DISABLE=1`` by hand), so the local/by-hand ratio
is the patch layer's cost. The model is fp32, dropout on, mock data.

    python benchmarks/megatron_lm_step.py [--reps 3] [--iters 12] [--impls local,transformer_engine]

The Megatron-LM directory comes from ``--megatron-lm DIR``, ``MEGATRON_LM_DIR``, or the vendored
tarball (``shared/vendor/megatron-lm-core_v0.16.1.tar.gz`` above the repository), unpacked to a
temporary directory.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARBALL = "megatron-lm-core_v0.16.1.tar.gz"
MODEL = ("--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "512",
         "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "4",
         "--global-batch-size", "8", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
         "--lr", "1e-3", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000")
_ELAPSED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([0-9.]+)")
_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*lm loss: (\S+) \|")


def patch_by_hand() -> None:
    """The minimum monkeypatches for pretrain_gpt.py --transformer-impl local without CUDA, by hand.

    Megatron-LM asserts CUDA exists and counts devices before it builds its process groups; its
    training loop and megatron-core pass ``torch.cuda.current_device()`` and ``"cuda"`` as
    devices, compare CUDA type names, seed and fork the CUDA generator, synchronize, and read
    memory statistics. Import-time needs: a ``triton`` stand-in, no ``make`` and no ``nvcc``.
    """
    import types

    import torch

    cpu = torch.device("cpu")
    # gradient_accumulation_fusion (on by default): apex's in-place weight-gradient GEMM (megatron-core probes at import)
    wgrad = types.ModuleType("fused_weight_gradient_mlp_cuda")
    wgrad.wgrad_gemm_accum_fp32 = lambda inp, grad_out, main_grad: main_grad.addmm_(grad_out.t(), inp)
    wgrad.wgrad_gemm_accum_fp16 = wgrad.wgrad_gemm_accum_fp32
    sys.modules["fused_weight_gradient_mlp_cuda"] = wgrad
    # import time: megatron-core's batch-invariant kernels import triton unconditionally; a stand-in
    # only while they import, after megatron-core (whose jit_fuser imports torch's dynamo, which reads
    # a triton it finds as a real one and breaks)
    import megatron.core  # noqa: F401

    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.jit = lambda fn=None, **kw: (lambda f: f) if fn is None else fn
    triton.cdiv = lambda a, b: (a + b - 1) // b
    language.constexpr = object
    triton.language = language
    sys.modules.update({"triton": triton, "triton.language": language})
    import megatron.core.transformer.custom_layers.batch_invariant_kernels  # noqa: F401

    del sys.modules["triton"], sys.modules["triton.language"]
    # CUDA as Megatron-LM reads it
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda device: None
    torch.cuda.current_device = lambda: cpu
    torch.cuda.synchronize = lambda device=None: None

    class Stream:  # one stream on the host: waiting is a no-op, using it is the default context
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

        def synchronize(self):
            pass

    import contextlib

    torch.cuda.Stream = Stream
    torch.cuda.current_stream = lambda device=None: Stream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.cuda.empty_cache = lambda: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(torch.cuda, name, lambda device=None: 0)
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._set_cuda_rng_state = lambda state, device=-1, graph_safe=False: torch.set_rng_state(state)
    mrandom._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    import logging  # one generator on the host: the tracker's CPU-RNG warning fires at every dropout

    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    # literal device="cuda" in megatron-core's optimizer and gradient clipping, Megatron-LM's training loop
    for name in ("tensor", "zeros", "ones", "empty", "rand", "randn", "full", "arange"):
        original = getattr(torch, name)

        def on_host(*args, _original=original, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = cpu
            return _original(*args, **kwargs)

        setattr(torch, name, on_host)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    type_of = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):  # Megatron compares CUDA type names
        if dtype is None:
            return type_of(self).replace("torch.", "torch.cuda.", 1)
        return type_of(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
    # _compile_dependencies: the wheel has the compiled dataset helpers and no Makefile; no nvcc
    import megatron.core.datasets.utils as dutils

    dutils.compile_helpers = lambda: None
    import megatron.legacy.fused_kernels as fused_kernels

    fused_kernels.load = lambda args: None
    use_the_fused_paths_megatron_picks()


def use_the_fused_paths_megatron_picks() -> None:
    """What a GPU run gets from megatron's fused paths, written by hand with torch's own fused ops.

    Without Transformer Engine and apex, megatron-core falls back to paths a GPU run never takes:
    its bias-GeLU is a hand-written tanh formula of ~10 elementwise ops each way, which a GPU run
    compiles into one kernel (``jit_fuser`` is ``torch.compile``; here it runs eagerly, as no C
    compiler is assumed); its Adam is torch's per-parameter loop (TE's / apex's FusedAdam on a
    GPU); its gradient clipping and copies are Python loops over tensors (apex's ``amp_C``). A
    by-hand port that is fair to compare with gets the same arithmetic from torch's fused ops, as
    ascend_patch's ops do: ``F.gelu(approximate="tanh")``, ``AdamW(fused=True)``, ``torch._foreach_*``.
    """
    import torch
    import torch.nn.functional as F

    import megatron.core.fusions.fused_bias_gelu as fused_bias_gelu
    import megatron.core.transformer.mlp as mlp

    def bias_gelu_impl(input, bias):
        return F.gelu(input + bias, approximate="tanh")

    fused_bias_gelu.bias_gelu_impl = mlp.bias_gelu_impl = bias_gelu_impl  # mlp holds a by-value copy

    class FusedAdamW(torch.optim.AdamW):  # megatron-core builds torch.optim.AdamW(**kwargs) without TE/apex
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("fused", True)
            super().__init__(*args, **kwargs)

    torch.optim.AdamW = FusedAdamW

    def l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = torch._foreach_norm(tensor_lists[0])
        return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None

    def scale(chunk_size, noop_flag, tensor_lists, scale):
        if tensor_lists[0] is tensor_lists[1]:
            torch._foreach_mul_(tensor_lists[0], scale)
        else:
            torch._foreach_copy_(tensor_lists[1], torch._foreach_mul(tensor_lists[0], scale))

    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer

    clip_grads.l2_norm_impl = l2norm
    clip_grads.multi_tensor_scale_impl = optimizer.multi_tensor_scale_impl = scale


def by_hand_child(script: str, argv: list[str]) -> None:
    """torchrun child: the by-hand patches, then pretrain_gpt.py as ``__main__``."""
    patch_by_hand()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


def megatron_lm_dir(given: str | None) -> Path:
    if given or os.environ.get("MEGATRON_LM_DIR"):
        return Path(given or os.environ["MEGATRON_LM_DIR"])
    for parent in REPO.parents:
        tarball = parent / "shared" / "vendor" / TARBALL
        if tarball.is_file():
            into = Path(tempfile.mkdtemp(prefix="megatron-lm-"))
            with tarfile.open(tarball) as tar:
                tar.extractall(into, filter="data")
            return next(into.glob("*/pretrain_gpt.py")).parent
    raise SystemExit(f"no Megatron-LM: give --megatron-lm DIR or MEGATRON_LM_DIR, or put {TARBALL} in shared/vendor")


def launch(mode: str, root: Path, iters: int, nproc: int, threads: int) -> tuple[list[float], list[float], str]:
    """One process group of ``mode``; returns (elapsed ms per iteration, losses, error or '')."""
    script = str(root / "pretrain_gpt.py")
    args = [*MODEL, "--train-iters", str(iters)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH") and k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(PYTHONPATH=os.pathsep.join([str(root), str(REPO), env.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(threads))
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    if mode == "by_hand":
        env.update(ASCEND_PATCH="0", TORCHDYNAMO_DISABLE="1", CUDA_DEVICE_MAX_CONNECTIONS="1")
        cmd = [*run, str(Path(__file__).resolve()), "--child", script, "--", *args, "--transformer-impl", "local",
               "--distributed-backend", "gloo", "--no-persist-layer-norm"]  # no apex: torch's LayerNorm
    else:
        impl = mode.split(":", 1)[1]
        env.update(ASCEND_PATCH_DEVICE="cpu")
        cmd = [*run, "-m", "ascend_patch", script, *args, "--transformer-impl", impl]
    done = subprocess.run(cmd, cwd=tempfile.mkdtemp(prefix="mlm-bench-"), env=env, capture_output=True, text=True)
    out = done.stdout + done.stderr
    if os.environ.get("MEGATRON_LM_STEP_LOG"):  # the launch's whole output, to look into a failure
        with open(os.environ["MEGATRON_LM_STEP_LOG"], "a") as f:
            f.write(f"=== {mode}\n{out}\n")
    if done.returncode != 0:
        errors = [line for line in out.splitlines()
                  if re.search(r"\w+(Error|Exception)\b: ", line) and "ChildFailedError" not in line]
        return [], [], (errors[-1].strip() if errors else f"exit status {done.returncode}")
    elapsed = {int(i): float(ms) for i, ms in _ELAPSED.findall(out)}
    losses = {int(i): float(v) for i, v in _LOSS.findall(out)}
    return [elapsed[i] for i in sorted(elapsed)], [losses[i] for i in sorted(losses)], ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="process groups per mode, alternating")
    parser.add_argument("--iters", type=int, default=12, help="iterations per process group")
    parser.add_argument("--warmup", type=int, default=2, help="first iterations of each process not timed")
    parser.add_argument("--impls", default="local,transformer_engine", help="--transformer-impl values to compare")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--megatron-lm", help="a Megatron-LM directory (default: the vendored tarball)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        by_hand_child(args.child, rest[1:] if rest[:1] == ["--"] else rest)
        return
    root = megatron_lm_dir(args.megatron_lm)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    modes = [f"ascend_patch:{impl}" for impl in impls] + ["by_hand"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    per_launch: dict[str, list[float]] = {m: [] for m in modes}  # each launch's median, rep by rep
    losses: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    for rep in range(args.reps):
        for mode in (modes if rep % 2 == 0 else modes[::-1]):
            if mode in failed:
                continue
            elapsed, loss, error = launch(mode, root, args.iters, args.nproc, args.threads)
            if error:
                failed[mode] = error
                continue
            times[mode] += elapsed[args.warmup:]
            per_launch[mode].append(statistics.median(elapsed[args.warmup:]))
            losses[mode] = loss
    print(f"Megatron-LM pretrain_gpt.py (4 layers, hidden 128, seq 128, 8 samples per iteration, fp32, dropout 0.1), "
          f"{args.nproc} process(es) x {args.threads} thread(s); {args.reps} launches x {args.iters - args.warmup} "
          f"timed iterations per mode (median of Megatron's elapsed time per iteration; per launch in brackets)")
    median = {m: statistics.median(t) for m, t in times.items() if t}
    for mode in modes:
        if mode in failed:
            print(f"  {mode:34s}: cannot run here: {failed[mode]}")
        elif mode in median:
            launches = " ".join(f"{t:.1f}" for t in per_launch[mode])
            print(f"  {mode:34s}: {median[mode]:8.1f} ms/iteration [{launches}]   "
                  f"losses {' '.join(f'{x:.4f}' for x in losses[mode][:3])} ...")

    def paired(a: str, b: str) -> str:
        """The ratio of the two modes' medians, and the median of the ratios of launches run next to each other
        (on a shared machine the load drifts between launches; adjacent launches see about the same)."""
        pairs = [x / y for x, y in zip(per_launch[a], per_launch[b])]
        return f"{median[a] / median[b]:.3f}x (launch pairs: median {statistics.median(pairs):.3f}x, " \
               f"{' '.join(f'{r:.3f}' for r in pairs)})"

    local = "ascend_patch:local"
    if local in median and "by_hand" in median:
        print(f"  ascend_patch / by hand (local impl): {paired(local, 'by_hand')}  (goal <= 1.02x)")
    for impl in impls:
        mode = f"ascend_patch:{impl}"
        if impl != "local" and mode in median and local in median:
            print(f"  --transformer-impl {impl} / local: {paired(mode, local)}  (goal <= 1.05x)")
        elif impl != "local" and mode in failed:
            print(f"  --transformer-impl {impl} / local: not measured ({impl} cannot run here)")

if __name__ == "__main__":
    main()
