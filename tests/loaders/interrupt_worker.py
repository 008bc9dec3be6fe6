"""Child for the interruption tests: a conversion that pauses mid-way (after some tensors are written).

Usage: interrupt_worker.py LOAD SAVE LOADER SAVER TP PP
Prints "PAUSED <staging dir entries>" once a few tensors are on disk, then waits to be killed.

The pause waits on signal.set_wakeup_fd, not in time.sleep: ``import numpy`` starts OpenBLAS's
thread pool, whose threads do not block signals, and a SIGTERM the kernel hands to one of them
never interrupts a sleep of the main thread (the conversion's own waits end at every worker
event, so it acts on the signal either way; a sleeping test callback did not, and the test
timed out). Whichever thread takes the signal writes to the wakeup fd, which ends the wait.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions


def main() -> int:
    load, save, loader, saver, tp, pp = sys.argv[1:7]
    # Ctrl-C as a terminal delivers it: a test run started in the background (``&`` in a script, nohup) hands
    # its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seen = {"n": 0}
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.set_wakeup_fd(woken)

    def on_progress(event: str, info: dict) -> None:
        if event == "tensor":
            seen["n"] += 1
            if seen["n"] == 6:
                parent = os.path.dirname(os.path.abspath(save))
                staged = [e for e in os.listdir(parent) if e.startswith(".ascend_patch-partial-")]
                print("PAUSED", " ".join(staged), flush=True)
                select.select([wake], [], [], 600)  # the signal's handler runs (and raises) right after

    convert(load, save, loader, saver, ConvertOptions(target_tp=int(tp), target_pp=int(pp)), on_progress=on_progress)
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
