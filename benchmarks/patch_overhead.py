"""What the device adaptor costs, measured side by side in one run on the cpu target.

    python benchmarks/patch_overhead.py [--rounds 7]

(a) patched torch.empty(8, device="cuda") vs native torch.empty(8, device="cpu")   goal <= 1.25
(b) torch.add (no device argument) patched vs unpatched                              goal 1.00 +- 0.03
(c) `import ascend_patch` on top of `import torch` (fresh interpreters)              goal <= 150 ms
    (with torch's pending full garbage collection settled first; the raw figure and
    that collection's own cost are printed beside it — see import_time)
(d) one training step of examples/mnist_cnn.py patched vs the model written for cpu  goal <= 2 % overhead

Patched and unpatched measurements alternate round by round (apply / remove between
them, the first side alternating too); each figure is the best round, each round being
the best of several repeats, so a noisy neighbour inflates neither side. The training
step is the median over many short alternating blocks of one shared model (see
training_step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
os.environ["ASCEND_PATCH"] = "0"  # this script applies and removes explicitly
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples"))

import torch  # noqa: E402

import ascend_patch  # noqa: E402
from ascend_patch.config import Settings  # noqa: E402

CPU = Settings(device="cpu")


def best_per_call(stmt, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def alternate(native, patched, rounds: int) -> tuple[float, float]:
    """Best over rounds of (native, patched) timings, patching only around `patched`.

    The two sides alternate, and which one goes first alternates too; the best round of each
    is the cost least disturbed by whatever else the machine was doing.
    """
    n, p = [], []
    for i in range(rounds):
        if i % 2:
            with ascend_patch.patched(CPU):
                p.append(patched())
            n.append(native())
        else:
            n.append(native())
            with ascend_patch.patched(CPU):
                p.append(patched())
    return min(n), min(p)


def factory(rounds: int) -> tuple[float, float]:
    return alternate(lambda: best_per_call(lambda: torch.empty(8, device="cpu"), 20000),
                     lambda: best_per_call(lambda: torch.empty(8, device="cuda"), 20000), rounds)


def no_device_op(rounds: int) -> tuple[float, float]:
    a, b = torch.ones(8), torch.ones(8)
    call = lambda: torch.add(a, b)  # noqa: E731
    return alternate(lambda: best_per_call(call, 50000), lambda: best_per_call(call, 50000), rounds)


def import_time(rounds: int) -> dict[str, tuple[float, float]]:
    """Fresh interpreters timing ``import ascend_patch`` after ``import torch``, three ways.

    ``raw``: as a script sees it. torch's import leaves its ~170k objects pending for the
    cyclic garbage collector, and the next ~20k allocations of any kind trigger a full
    collection; our import is big enough to be the one that pays it. ``settled``: the
    same with that collection run (untimed) after ``import torch``, so only our own work
    and the collections our own objects cause are counted. ``debt``: what that full
    collection costs alone; the process pays it soon after ``import torch`` either way.
    """
    codes = {
        "raw": "import time, torch\n",
        "settled": "import gc, time, torch\ngc.collect()\n",
    }
    measure = ("t = time.perf_counter()\n"
               "import ascend_patch\n"
               "print(time.perf_counter() - t, ascend_patch.active_backend().name)\n")
    debt = ("import gc, time, torch\n"
            "t = time.perf_counter()\n"
            "gc.collect()\n"
            "print(time.perf_counter() - t, 'cpu')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["ASCEND_PATCH_DEVICE"] = "cpu"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode cached
    programs = {name: head + measure for name, head in codes.items()}
    programs["debt"] = debt
    subprocess.run([sys.executable, "-c", programs["raw"]], capture_output=True, env=env, check=True)  # warm the cache
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, code in programs.items():  # interleaved, so drift hits every figure alike
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            seconds, target = out.stdout.split()
            assert target == "cpu", out.stdout
            times[name].append(float(seconds))
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def training_step(rounds: int, steps: int = 3) -> tuple[float, float]:
    """Median step time of one model trained natively (device "cpu") and patched (device "cuda").

    One model and optimizer serve both sides, in short blocks of ``steps`` steps that
    alternate (patch applied around the patched blocks only), so both sides see the same
    weights, caches and machine load; 4 x ``rounds`` blocks per side.
    """
    import mnist_cnn

    torch.manual_seed(0)
    data = [(torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))) for _ in range(4)]
    model = mnist_cnn.Net().to("cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times: dict[str, list[float]] = {"cpu": [], "cuda": []}

    def block(device: str, start: int) -> None:
        for i in range(start, start + steps):
            x, y = data[i % len(data)]
            begin = timeit.default_timer()
            mnist_cnn.train_step(model, optimizer, x.to(device), y.to(device))
            times[device].append(timeit.default_timer() - begin)

    block("cpu", 0)  # warm up
    times["cpu"].clear()
    for b in range(8 * rounds):
        device = "cuda" if (b % 2) ^ (b // 2 % 2) else "cpu"  # cpu, cuda, cuda, cpu, cpu, cuda, ...
        if device == "cuda":
            with ascend_patch.patched(CPU):
                block(device, b * steps)
        else:
            block(device, b * steps)
    return statistics.median(times["cpu"]), statistics.median(times["cuda"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds\n")

    native, patched = factory(args.rounds)
    print(f"(a) torch.empty(8): native cpu {native * 1e9:7.0f} ns, patched 'cuda' {patched * 1e9:7.0f} ns, "
          f"ratio {patched / native:.3f} (goal <= 1.25)")
    unpatched, patched = no_device_op(args.rounds)
    print(f"(b) torch.add: unpatched {unpatched * 1e9:7.0f} ns, patched {patched * 1e9:7.0f} ns, "
          f"ratio {patched / unpatched:.3f} (goal 1.00 +- 0.03)")
    imports = import_time(args.rounds)
    (median, best), (raw_median, raw_best), (debt, _) = imports["settled"], imports["raw"], imports["debt"]
    print(f"(c) import ascend_patch after import torch: median {median * 1e3:.1f} ms, best {best * 1e3:.1f} ms "
          f"(goal <= 150 ms)\n"
          f"    as a script sees it, including the full garbage collection torch's import left due: "
          f"median {raw_median * 1e3:.1f} ms, best {raw_best * 1e3:.1f} ms; that collection alone: "
          f"{debt * 1e3:.1f} ms")
    native, patched = training_step(args.rounds)
    print(f"(d) mnist_cnn training step: native cpu {native * 1e3:.2f} ms, patched 'cuda' {patched * 1e3:.2f} ms, "
          f"overhead {100 * (patched / native - 1):+.2f} % (goal <= 2 %)")


if __name__ == "__main__":
    main()
