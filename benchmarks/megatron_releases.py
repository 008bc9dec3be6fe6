"""Time per iteration of each Megatron release's own pretrain_gpt.py under ascend_patch, relative to 0.16.1,
measured side by side in one run.

Every release of the test harness (``tests/megatron_lm/mlm_harness.py``: the vendored Megatron-LM snapshots
0.12.1 ... 0.17.1 and main@d98e8a6) launches the same model with the same line: Megatron-LM's default
``--transformer-impl transformer_engine`` (ascend_patch's TE-compatible layer) at TP2 with sequence
parallelism, 2 processes x 1 thread, fp32, dropout 0.1, mock data, under ``torchrun -m ascend_patch``. The
vocabulary is 4096 for every release (the mock data of releases before 0.16 draws token ids up to 4094), so
the model is the same everywhere. Releases alternate launch by launch (in order, then reversed, ...), each
in processes of its own; the figure per release is the median of Megatron's own ``elapsed time per iteration
(ms)`` over the timed iterations of its launches (the first ``--warmup`` of each launch left out), and the
ratio to 0.16.1 is given both as the ratio of the medians and per pair of launches run in the same round
(on a shared machine the load drifts between rounds). A release that cannot run is reported with its first
error and left out of the ratios.

main runs on Python 3.12 (``tests/megatron_lm/py312_env.py`` builds that environment when it is missing;
its torch is the registry's CUDA build of 2.13.0, the others' the CPU build, on the same cpu target), once
with triton hidden (``main``, as on an Ascend host) and once with it importable (``main+triton``).

    python benchmarks/megatron_releases.py [--reps 3] [--iters 10] [--releases 0.12.1,...,main,main+triton]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "megatron_lm"), str(REPO / "tests")]

from mlm_harness import RELEASES, MegatronLM, MegatronRunFailed, first_error, find_tarball, python_tools, unpack  # noqa: E402

REFERENCE = "0.16.1"
DEFAULT_RELEASES = (*RELEASES, "main+triton")
MODEL = ("--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "512",
         "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "4",
         "--global-batch-size", "8", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096",
         "--lr", "1e-3", "--seed", "1234", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
         "--tensor-model-parallel-size", "2", "--sequence-parallel")
_ELAPSED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([0-9.]+)")


def release_launcher(name: str, into: Path) -> MegatronLM:
    """Megatron-LM ``name`` unpacked under ``into``, with the interpreter it needs (as the tests' fixture does)."""
    release = name.partition("+")[0]
    tree = into / release
    if not tree.exists():
        unpack(find_tarball(release), tree)
    root = next(tree.glob("*/pretrain_gpt.py")).parent
    python = sys.executable
    if sys.version_info[:2] < RELEASES[release].python:
        import py312_env

        python = str(py312_env.ensure())
    mlm = MegatronLM(root, python=python, tools=python_tools(python, into / f"tools-{release}"), name=name,
                     hide_triton=name == "main")
    mlm.build_helpers()
    return mlm


def launch(mlm: MegatronLM, iters: int, work: Path) -> tuple[list[float], list[float], str]:
    """One launch; (elapsed ms per iteration, losses, first error or '')."""
    try:
        run = mlm.run([*MODEL, "--train-iters", str(iters)], work, nproc=2, timeout=900)
    except MegatronRunFailed as failure:
        return [], [], first_error(str(failure)) or str(failure).splitlines()[0]
    elapsed = {int(i): float(ms) for i, ms in _ELAPSED.findall(run.output)}
    return [elapsed[i] for i in sorted(elapsed)], run.losses, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="launches per release, in alternating rounds")
    parser.add_argument("--iters", type=int, default=10, help="iterations per launch")
    parser.add_argument("--warmup", type=int, default=2, help="first iterations of each launch not timed")
    parser.add_argument("--releases", default=",".join(DEFAULT_RELEASES), help="releases to compare (with 0.16.1)")
    args = parser.parse_args()
    names = [n.strip() for n in args.releases.split(",") if n.strip()]
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    into = Path(tempfile.mkdtemp(prefix="megatron-releases-"))
    try:
        launchers = {name: release_launcher(name, into) for name in names}
        times: dict[str, list[float]] = {n: [] for n in names}
        per_launch: dict[str, dict[int, float]] = {n: {} for n in names}  # round -> that launch's median
        losses: dict[str, list[float]] = {}
        failed: dict[str, str] = {}
        for rep in range(args.reps):
            for name in (names if rep % 2 == 0 else names[::-1]):
                if name in failed:
                    continue
                elapsed, loss, error = launch(launchers[name], args.iters, into / "runs" / f"{name}-{rep}")
                if error:
                    failed[name] = error
                    continue
                timed = elapsed[args.warmup:]
                times[name] += timed
                per_launch[name][rep] = statistics.median(timed)
                losses[name] = loss
    finally:
        shutil.rmtree(into, ignore_errors=True)
    print(f"Megatron-LM pretrain_gpt.py, default --transformer-impl transformer_engine, TP2 + sequence parallelism "
          f"(4 layers, hidden 128, seq 128, vocab 4096, 8 samples per iteration, fp32, dropout 0.1), 2 processes x 1 "
          f"thread; {args.reps} launches x {args.iters - args.warmup} timed iterations per release, alternating "
          f"(median of Megatron's elapsed time per iteration; per launch in brackets)")
    median = {n: statistics.median(t) for n, t in times.items() if t}
    for name in names:
        label = f"{name} ({RELEASES[name.partition('+')[0]].commit[:7]})"
        if name in failed:
            print(f"  {label:24s}: cannot run: {failed[name]}")
            continue
        launches = " ".join(f"{t:.1f}" for t in per_launch[name].values())
        ratio = ""
        if name != REFERENCE and REFERENCE in median:
            pairs = [per_launch[name][r] / per_launch[REFERENCE][r] for r in per_launch[name] if r in per_launch[REFERENCE]]
            ratio = (f"  {median[name] / median[REFERENCE]:.3f}x 0.16.1 (pairs: median "
                     f"{statistics.median(pairs):.3f}x, {' '.join(f'{p:.3f}' for p in pairs)})") if pairs else ""
        print(f"  {label:24s}: {median[name]:8.1f} ms/iteration [{launches}]{ratio}   "
              f"losses {' '.join(f'{x:.4f}' for x in losses[name][:3])} ...")


if __name__ == "__main__":
    main()
