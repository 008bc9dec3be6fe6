"""Child for the interruption tests: a conversion that pauses mid-way (after some tensors are written).

Usage: interrupt_worker.py LOAD SAVE LOADER SAVER TP PP
Prints "PAUSED <staging dir entries>" once a few tensors are on disk, then waits to be killed.
"""

from __future__ import annotations

import os
import sys
import time

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions


def main() -> int:
    load, save, loader, saver, tp, pp = sys.argv[1:7]
    seen = {"n": 0}

    def on_progress(event: str, info: dict) -> None:
        if event == "tensor":
            seen["n"] += 1
            if seen["n"] == 6:
                parent = os.path.dirname(os.path.abspath(save))
                staged = [e for e in os.listdir(parent) if e.startswith(".ascend_patch-partial-")]
                print("PAUSED", " ".join(staged), flush=True)
                time.sleep(600)

    convert(load, save, loader, saver, ConvertOptions(target_tp=int(tp), target_pp=int(pp)), on_progress=on_progress)
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
