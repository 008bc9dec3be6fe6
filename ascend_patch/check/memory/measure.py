"""Measure the same terms on a real run: ``torchrun ... -m ascend_patch.check.memory.measure --out DIR script.py ARGS``.

Runs the launch's script unchanged (patched for the target the environment selects, as
``-m ascend_patch`` does), with the recording of :mod:`.megatron_lm` on real tensors: the
terms of its second iteration, tracked by torch's ``MemTracker`` exactly as the estimate
tracks them, are written to ``DIR/rank<N>.json`` by every rank, and the run goes on. The
accuracy tests compare the estimate with these files; on an NPU host the same command
measures the live tensor bytes there (what the estimate's tensor terms stand for).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from collections.abc import Sequence
from dataclasses import asdict

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``script ARGS`` and write this rank's terms of iteration 2 to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m ascend_patch.check.memory.measure")
    parser.add_argument("--out", required=True, help="directory for rank<N>.json")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    import ascend_patch

    ascend_patch.apply()
    script = os.path.abspath(ns.script)
    sys.path.insert(0, os.path.dirname(script))
    os.makedirs(ns.out, exist_ok=True)

    def write(record: object) -> None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        data = {"rank": rank, "terms": asdict(record.terms),  # type: ignore[attr-defined]
                "num_microbatches": record.num_microbatches}  # type: ignore[attr-defined]
        with open(os.path.join(ns.out, f"rank{rank}.json"), "w") as f:
            json.dump(data, f)

    from .megatron_lm import recorded_steps

    sys.argv = [script, *ns.args]
    with recorded_steps(synthetic_data=False, stop_after=False, on_terms=write):
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
