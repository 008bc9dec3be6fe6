"""gloo's worker threads finish freeing their last collectives while Python can still run.

A gloo process group runs each collective on a worker thread (``pt_gloo_runloop``), which
drops its reference to the finished work a moment after the caller's ``wait()`` returned.
When that is the last reference to a Python object, the drop takes the GIL: the
``contextvars`` context every ``backward()`` stashes in thread-local state (each collective
launched during the backward, DDP's gradient all-reduce among them, captures it), or a tensor
the program already let go. Once the interpreter is finalizing, taking the GIL ends the thread
from inside a ``noexcept`` destructor: ``terminate called without an active exception``
(SIGABRT) after the run finished. It happens unpatched with gloo as well (about 1 run in 12 of
a 2-process DDP script on a loaded host). A group destroyed while holding the GIL (DDP's
``~Reducer`` after ``destroy_process_group``) while a worker waits for the GIL hangs instead.

So, with the GIL released, this module waits until every gloo worker thread is idle:

* at exit (an ``atexit`` handler registered when the patches are applied, so it runs after the
  handlers the program registers later), and
* after ``destroy_process_group``: whatever still holds a group then destroys it with idle
  workers.

Idle: every ``pt_gloo_runloop`` thread asleep, with no context switch over one poll interval
while this thread slept (Linux ``/proc``; elsewhere one short sleep), at most :data:`CAP`
seconds. A collective still waiting for its peers (an ``async_op`` never waited for) is asleep
too: it is not drained, and exiting with one in flight can still abort.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Any

from ..patch import Action, Patch, Replace, replacing

__all__ = ["CAP", "WORKER_THREAD", "quiesce_gloo_workers", "teardown_patches"]

WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads
CAP = 10.0  # seconds: a worker busy for longer is left as it is
_POLL = 0.02
_registered = [False]


def _worker_states() -> dict[str, tuple[str, int]] | None:
    """Thread id -> (scheduler state, context switches so far) of gloo's workers; None without /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    states = {}
    for tid in tids:
        base = f"/proc/self/task/{tid}/"
        try:
            with open(base + "comm") as f:
                if f.read().strip() != WORKER_THREAD:
                    continue
            with open(base + "stat") as f:
                stat = f.read()
            with open(base + "status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        states[tid] = (stat[stat.rindex(")") + 2], switches)
    return states


def quiesce_gloo_workers(cap: float = CAP) -> bool:
    """Sleep, the GIL released, until gloo's worker threads are idle; False if ``cap`` ran out first."""
    before = _worker_states()
    if before is None:
        time.sleep(5 * _POLL)
        return True
    if not before:
        return True
    deadline = time.monotonic() + cap
    while True:
        time.sleep(_POLL)  # a worker waiting for the GIL takes it now
        now = _worker_states()
        if now == before and all(state == "S" for state, _ in now.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        before = now


def _destroy(original: Any) -> Any:
    if not _registered[0]:
        _registered[0] = True
        atexit.register(quiesce_gloo_workers)  # once per process; a no-op without gloo workers

    @replacing(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        quiesce_gloo_workers()
        return result

    return destroy_process_group


def teardown_patches() -> list[Patch]:
    """``destroy_process_group`` waits for idle gloo workers; applying registers the same wait at exit."""
    return [Replace("torch.distributed.distributed_c10d:destroy_process_group",
                    "waits (GIL released) until gloo's worker threads are idle, here and at exit, so none "
                    "frees a Python object while the interpreter finalizes (SIGABRT) or under ~Reducer (hang)",
                    make=_destroy, action=Action.EMULATED, count_calls=False)]
