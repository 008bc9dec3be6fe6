"""What the version-range fast path saves, measured side by side in one run.

    python benchmarks/version_check.py [--rounds 7]

(a) `import packaging.specifiers` in a fresh interpreter that has imported torch and
    packaging.version already: the cost every `import ascend_patch` would pay without the
    fast path (a built-in patch checks torch's version at apply).
(b) one check of ">=2.13,<2.14" against "2.13.0+cpu": the fast path vs
    SpecifierSet(...).contains (a new SpecifierSet per check, as the fallback does).

Fresh interpreters alternate between importing only packaging.version and importing
both; figures are medians over the rounds.
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
sys.path.insert(0, REPO)
os.environ["ASCEND_PATCH"] = "0"

_IMPORT = ("import gc, time, torch\n"
           "gc.collect()\n"
           "t = time.perf_counter()\n"
           "import packaging.version\n"
           "t1 = time.perf_counter()\n"
           "{second}"
           "print(time.perf_counter() - t1)\n")


def import_cost(rounds: int) -> tuple[float, float]:
    """Median seconds of the step after `import packaging.version`: nothing, or `import packaging.specifiers`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["ASCEND_PATCH"] = "0"
    codes = {"version only": _IMPORT.format(second=""),
             "with specifiers": _IMPORT.format(second="import packaging.specifiers\n")}
    times: dict[str, list[float]] = {name: [] for name in codes}
    for i in range(rounds):
        for name in (list(codes) if i % 2 else list(reversed(codes))):
            out = subprocess.run([sys.executable, "-c", codes[name]], capture_output=True, text=True, env=env,
                                 check=True)
            times[name].append(float(out.stdout))
    return statistics.median(times["version only"]), statistics.median(times["with specifiers"])


def per_check(rounds: int) -> tuple[float, float]:
    from packaging.specifiers import SpecifierSet

    from ascend_patch.patching.versions import _plain_in_range

    installed, spec = "2.13.0+cpu", ">=2.13,<2.14"
    assert _plain_in_range(installed, spec) is SpecifierSet(spec).contains(installed) is True
    fast = min(timeit.repeat(lambda: _plain_in_range(installed, spec), number=2000, repeat=rounds)) / 2000
    full = min(timeit.repeat(lambda: SpecifierSet(spec).contains(installed), number=2000, repeat=rounds)) / 2000
    return fast, full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    base, with_specifiers = import_cost(args.rounds)
    print(f"(a) import packaging.specifiers after packaging.version: {(with_specifiers - base) * 1e3:.1f} ms "
          f"(median of {args.rounds} fresh interpreters each way)")
    fast, full = per_check(args.rounds)
    print(f"(b) one range check: fast path {fast * 1e6:.1f} us, SpecifierSet {full * 1e6:.1f} us, "
          f"ratio {full / fast:.1f}")


if __name__ == "__main__":
    main()
