"""What the device adaptor costs, measured side by side in one run on the cpu target.

    python benchmarks/patch_overhead.py [--rounds 5]

(a) patched torch.empty(8, device="cuda") vs native torch.empty(8, device="cpu")   goal <= 1.25
(b) torch.add (no device argument) patched vs unpatched                              goal 1.00 +- 0.03
(c) `import ascend_patch` on top of `import torch` (fresh interpreters)              goal <= 150 ms
(d) one training step of examples/mnist_cnn.py patched vs the model written for cpu  goal <= 2 % overhead

Patched and unpatched measurements alternate round by round (apply / remove between
them) and each figure is the median over rounds of the best of several repeats, so a
noisy neighbour moves both sides alike.
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
    """Median over rounds of (native, patched) timings, patching only around `patched`."""
    n, p = [], []
    for _ in range(rounds):
        n.append(native())
        with ascend_patch.patched(CPU):
            p.append(patched())
    return statistics.median(n), statistics.median(p)


def factory(rounds: int) -> tuple[float, float]:
    return alternate(lambda: best_per_call(lambda: torch.empty(8, device="cpu"), 20000),
                     lambda: best_per_call(lambda: torch.empty(8, device="cuda"), 20000), rounds)


def no_device_op(rounds: int) -> tuple[float, float]:
    a, b = torch.ones(8), torch.ones(8)
    call = lambda: torch.add(a, b)  # noqa: E731
    return alternate(lambda: best_per_call(call, 50000), lambda: best_per_call(call, 50000), rounds)


def import_time(rounds: int) -> tuple[float, float]:
    code = ("import time, torch\n"
            "t = time.perf_counter()\n"
            "import ascend_patch\n"
            "print(time.perf_counter() - t, ascend_patch.active_backend().name)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["ASCEND_PATCH_DEVICE"] = "cpu"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode cached
    subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=True)  # warm the cache
    times = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        seconds, target = out.stdout.split()
        assert target == "cpu", out.stdout
        times.append(float(seconds))
    return statistics.median(times), min(times)


def training_step(rounds: int, steps: int = 20) -> tuple[float, float]:
    import mnist_cnn

    torch.manual_seed(0)
    data = [(torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))) for _ in range(4)]

    def run(device: str) -> float:
        torch.manual_seed(0)
        model = mnist_cnn.Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for x, y in data[:2]:  # warm up
            mnist_cnn.train_step(model, optimizer, x.to(device), y.to(device))
        timings = []
        for i in range(steps):
            x, y = data[i % len(data)]
            start = timeit.default_timer()
            mnist_cnn.train_step(model, optimizer, x.to(device), y.to(device))
            timings.append(timeit.default_timer() - start)
        return statistics.median(timings)

    return alternate(lambda: run("cpu"), lambda: run("cuda"), rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds\n")

    native, patched = factory(args.rounds)
    print(f"(a) torch.empty(8): native cpu {native * 1e9:7.0f} ns, patched 'cuda' {patched * 1e9:7.0f} ns, "
          f"ratio {patched / native:.3f} (goal <= 1.25)")
    unpatched, patched = no_device_op(args.rounds)
    print(f"(b) torch.add: unpatched {unpatched * 1e9:7.0f} ns, patched {patched * 1e9:7.0f} ns, "
          f"ratio {patched / unpatched:.3f} (goal 1.00 +- 0.03)")
    median, best = import_time(args.rounds)
    print(f"(c) import ascend_patch after import torch: median {median * 1e3:.1f} ms, best {best * 1e3:.1f} ms "
          f"(goal <= 150 ms)")
    native, patched = training_step(args.rounds)
    print(f"(d) mnist_cnn training step: native cpu {native * 1e3:.2f} ms, patched 'cuda' {patched * 1e3:.2f} ms, "
          f"overhead {100 * (patched / native - 1):+.2f} % (goal <= 2 %)")


if __name__ == "__main__":
    main()
