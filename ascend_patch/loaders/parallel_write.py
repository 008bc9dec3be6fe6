"""Writing a conversion's output files with several worker threads."""

from __future__ import annotations

import math
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..dtypes import itemsize
from ..models.weightmap import TensorPlan
from .blocks import BlockFiller, FileCache
from .formats import TargetFile

__all__ = ["UNIT_BYTES", "default_workers", "write_groups", "units"]

# The work is cut into units: a span of consecutive tensors of one lockstep group (the TP
# ranks of one stage, written tensor by tensor and block by block so each source block read
# serves all of them). Workers take units in order, so a single large file is shared between workers
# too; each worker has its own file descriptors, block buffer and read cache. The bytes
# move in ``copy_file_range`` / ``preadv`` / ``pwrite`` and numpy copies, which release the
# GIL: on a host the copies are memory-bound kernel work, so a second core is a second
# copy engine.
#
# Writers are opened when a group's first unit starts and closed after its last one.
# Everything the caller sees — the progress bar, ``on_progress`` events, the exception
# of a failed worker, a signal — happens in the calling thread: workers only put events
# on a queue, and block the usual asynchronous signals. On any exception there (a worker's
# error, ``Interrupted``, Ctrl-C) the workers stop after their current tensor and every open
# writer is aborted.
UNIT_BYTES = 64 * 1024 * 1024  # a unit is at least this much output (or a whole group when smaller)
_MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """One worker per core available to this process, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_WORKERS, cores))


def _tensor_bytes(plan: TensorPlan, dtype: str) -> int:
    return itemsize(dtype) * math.prod(plan.shape)


def units(groups: list[list[TargetFile]], unit_bytes: int | None = None) -> list[tuple[int, int, int]]:
    """(group index, first tensor, end tensor) spans of at least ``unit_bytes`` (:data:`UNIT_BYTES`) of output each."""
    unit_bytes = unit_bytes or UNIT_BYTES
    out = []
    for g, group in enumerate(groups):
        start, size = 0, 0
        count = len(group[0].tensors)
        for i in range(count):
            size += sum(_tensor_bytes(f.tensors[i], f.dtype) for f in group)
            if size >= unit_bytes or i == count - 1:
                out.append((g, start, i + 1))
                start, size = i + 1, 0
        if count == 0:
            out.append((g, 0, 0))
    return out


class _Stop(Exception):
    """A worker noticed the stop flag."""


class _Run:
    """State shared by the workers of one write: the unit queue, the open writers, the stop flag."""

    def __init__(self, groups: list[list[TargetFile]], spans: list[tuple[int, int, int]],
                 open_writer: Callable[[TargetFile, BlockFiller], Any],
                 finished: Callable[[TargetFile], None] | None = None) -> None:
        self.groups, self.open_writer, self.finished = groups, open_writer, finished
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._spans: Iterator[tuple[int, int, int]] = iter(spans)
        self._left = [0] * len(groups)
        for g, _, _ in spans:
            self._left[g] += 1
        self._writers: dict[int, list[Any]] = {}
        self._opening: dict[int, threading.Lock] = {}
        self.fine = True  # per-tensor and per-piece events (see write_groups)

    def next_unit(self) -> tuple[int, int, int] | None:
        with self.lock:
            return None if self.stop.is_set() else next(self._spans, None)

    def writers(self, g: int, filler: BlockFiller) -> list[Any]:
        # Opening lays each file out (a torch file: pickling its skeleton, ~10 ms per MoE rank file), so it
        # happens under the group's own lock: a worker taking or finishing a unit of another group is not held up.
        with self.lock:
            if g in self._writers:
                return self._writers[g]
            opening = self._opening.setdefault(g, threading.Lock())
        with opening:
            with self.lock:
                if g in self._writers:
                    return self._writers[g]
            opened: list[Any] = []
            try:
                for target in self.groups[g]:
                    opened.append(self.open_writer(target, filler))
            except BaseException:
                for w in opened:
                    w.abort()
                raise
            with self.lock:
                self._writers[g] = opened
            return opened

    def unit_done(self, g: int) -> None:
        with self.lock:
            self._left[g] -= 1
            if self._left[g]:
                return
            writers = self._writers.pop(g)
        for w in writers:
            w.close()
        for target in self.groups[g]:
            if self.finished is not None:  # in this worker: another one goes on writing meanwhile
                self.finished(target)
            self.events.put(("file", target.relpath))

    def abort_all(self) -> None:
        with self.lock:
            writers = [w for ws in self._writers.values() for w in ws]
            self._writers.clear()
        for w in writers:
            w.abort()


WriteTensor = Callable[[BlockFiller, list[Any], list[TensorPlan], str, np.ndarray, Callable[[int], None]], list[int]]


def write_groups(groups: list[list[TargetFile]], tensors: Any, workers: int,
                 open_writer: Callable[[TargetFile, BlockFiller], Any], write_tensor: WriteTensor,
                 block_bytes: int, on_event: Callable[[tuple[Any, ...]], None], fine_events: bool = True,
                 finished: Callable[[TargetFile], None] | None = None) -> None:
    """Write every file of ``groups`` with ``workers`` threads; ``on_event`` runs in this thread.

    ``write_tensor(filler, writers, tensors, dtype, buffer, advance)`` writes one tensor of every
    file of a group (the same tensor index: same shape and dtype) and returns the bytes of each;
    ``finished(target)`` runs in the worker after a file is closed (the engine's fsync).

    Events: ``("bytes", n)`` as data moves, ``("tensor", relpath, key, nbytes)`` after each
    tensor, ``("file", relpath)`` after each file is closed. With ``fine_events=False``
    (nobody watches progress) the first two become one ``("written", nbytes)`` per unit:
    each event wakes this thread, and an MoE checkpoint has thousands of tensors.
    """
    spans = units(groups)
    run = _Run(groups, spans, open_writer, finished)
    run.fine = fine_events
    threads = [threading.Thread(target=_worker, args=(run, tensors, write_tensor, block_bytes),
                                name=f"ascend_patch-convert-{k}", daemon=True)
               for k in range(max(1, min(workers, len(spans))))]
    _start_without_signals(threads)
    try:
        running = len(threads)
        while running:
            event = run.events.get()  # a signal's handler still runs (and may raise) while this waits
            if event[0] == "done":
                running -= 1
            elif event[0] == "error":
                raise event[1]
            else:
                on_event(event)
    except BaseException:
        run.stop.set()
        for t in threads:
            t.join()
        run.abort_all()
        raise
    for t in threads:
        t.join()


# Signals a user or a launcher sends; the workers block them, so the kernel delivers them to the
# calling thread. Delivered to a worker, a signal would not interrupt a blocking call of the
# calling thread (a time.sleep, a wait), and Ctrl-C or SIGTERM could go unnoticed.
_ASYNC_SIGNALS = {getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
                                                     "SIGALRM", "SIGCHLD", "SIGWINCH") if hasattr(signal, name)}


def _start_without_signals(threads: list[threading.Thread]) -> None:
    """Start ``threads`` with :data:`_ASYNC_SIGNALS` blocked in them (they inherit the mask at creation)."""
    if not hasattr(signal, "pthread_sigmask"):
        for t in threads:
            t.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
    try:
        for t in threads:
            t.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _worker(run: _Run, tensors: Any, write_tensor: Callable[..., int], block_bytes: int) -> None:
    files = FileCache()
    filler = BlockFiller(tensors, files)
    buffer = np.empty(block_bytes, dtype=np.uint8)  # pages are touched only as blocks use them

    def moved(n: int) -> None:
        if run.stop.is_set():
            raise _Stop
        if run.fine:
            run.events.put(("bytes", n))

    try:
        while (unit := run.next_unit()) is not None:
            g, lo, hi = unit
            group = run.groups[g]
            writers = run.writers(g, filler)
            written = 0
            for i in range(lo, hi):
                if run.stop.is_set():
                    return
                # the group's files together, block by block: a source block read once serves every file
                sizes = write_tensor(filler, writers, [t.tensors[i] for t in group], group[0].dtype, buffer, moved)
                for target, n in zip(group, sizes):
                    if run.fine:
                        run.events.put(("tensor", target.relpath, target.tensors[i].key, n))
                    written += n
            if not run.fine:
                run.events.put(("written", written))
            run.unit_done(g)
    except _Stop:
        return
    except BaseException as exc:  # handed to the calling thread, which raises it
        run.stop.set()
        run.events.put(("error", exc))
    finally:
        files.close()
        run.events.put(("done",))
