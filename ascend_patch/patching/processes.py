"""Children a patched process starts (``mp.spawn``, multiprocessing's ``spawn``) are patched too."""

from __future__ import annotations

import inspect
import os
from typing import Any

from ..config import Settings
from ..cpu_host import SPAWN_NPROCS
from ..patch import Patch, Wrap

__all__ = ["PatchedEntry", "patched_command_line", "process_patches"]


class PatchedEntry:
    """``fn`` run in a child after ascend_patch is applied there with the parent's settings."""

    def __init__(self, fn: Any, environ: dict[str, str], nprocs: int = 0) -> None:
        self.fn = fn
        self.environ = environ
        self.nprocs = nprocs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.update(self.environ)
        from . import report

        if self.nprocs and args and isinstance(args[0], int):  # start_processes passes the index first
            report.set_process_label(f"mp.spawn process {args[0]} of {self.nprocs}")
        report.apply_and_report()  # what ascend_patch.apply() does, from the layer that implements it
        return self.fn(*args, **kwargs)


def patched_command_line(command: list[Any], environ: dict[str, str]) -> list[Any]:
    """multiprocessing's spawn command line with ascend_patch applied before ``spawn_main`` runs."""
    if "-c" not in command:
        return command  # a frozen executable: no code to prefix
    at = command.index("-c") + 1
    prefix = (f"import os; os.environ.update({environ!r})\n"
              "try:\n import ascend_patch; ascend_patch.apply()\nexcept ImportError:\n pass\n")
    return [*command[:at], prefix + command[at], *command[at + 1:]]


def _nprocs(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    try:
        nprocs = inspect.signature(wrapped).bind(*args, **kwargs).arguments.get("nprocs", 1)
    except TypeError:
        return 0  # torch raises about the arguments itself
    return nprocs if isinstance(nprocs, int) and nprocs > 0 else 0


def process_patches(settings: Settings) -> list[Patch]:
    """The two patches that carry ``settings`` into child interpreters.

    ``mp.spawn``: the worker function is wrapped in a picklable :class:`PatchedEntry`
    that applies ascend_patch before calling it; on one node ``nprocs`` is the children's
    local world, so on the cpu target they see that many virtual devices from their first
    line on and label their report ``mp.spawn process i of N``. multiprocessing's ``spawn``
    start method (a ``Process``, ``Manager`` or ``Pool``; megatron-core's torch_dist writer
    starts one) re-imports the parent's main script before anything it was given runs:
    its command line applies ascend_patch first, so that import finds what the parent found.
    Launchers that start their own Python children rely on ``ASCEND_PATCH_AUTOLOAD=1``.
    """
    def start_processes(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        nprocs = _nprocs(wrapped, args, kwargs)
        if args and not isinstance(args[0], PatchedEntry):
            args = (PatchedEntry(args[0], settings.to_environ(), nprocs), *args[1:])
        elif "fn" in kwargs and not isinstance(kwargs["fn"], PatchedEntry):
            kwargs["fn"] = PatchedEntry(kwargs["fn"], settings.to_environ(), nprocs)
        if not nprocs:
            return wrapped(*args, **kwargs)
        from . import report

        if not report.process_label().endswith(", mp.spawn parent"):
            report.set_process_label(report.process_label() + ", mp.spawn parent")
        # the children inherit the environment when they start (before they re-import the main
        # script): nprocs is their local world; the parent's own count is unchanged afterwards
        before = os.environ.get(SPAWN_NPROCS)
        os.environ[SPAWN_NPROCS] = str(nprocs)
        try:
            return wrapped(*args, **kwargs)
        finally:
            if before is None:
                os.environ.pop(SPAWN_NPROCS, None)
            else:
                os.environ[SPAWN_NPROCS] = before

    def command_line(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return patched_command_line(wrapped(*args, **kwargs), settings.to_environ())

    return [Wrap("torch.multiprocessing.spawn:start_processes", "spawned workers apply ascend_patch before running",
                 wrapper=start_processes, count_calls=False),
            Wrap("multiprocessing.spawn:get_command_line",
                 "multiprocessing's spawn children apply ascend_patch before re-importing the main script",
                 wrapper=command_line, count_calls=False)]
