"""Child processes started with ``torch.multiprocessing.spawn`` are patched too.

Spawned children are fresh interpreters: the worker function is wrapped in a
picklable entry point that applies ascend_patch (with the parent's settings)
before calling it. Launchers that start their own Python children can rely on
``ASCEND_PATCH_AUTOLOAD=1`` instead (the installed ``.pth`` file honours it).
"""

from __future__ import annotations

import os
from typing import Any

from ..config import Settings
from ..patch import Patch, Wrap

__all__ = ["PatchedEntry", "process_patches"]


class PatchedEntry:
    """``fn`` run in a child after ascend_patch is applied there with the parent's settings."""

    def __init__(self, fn: Any, environ: dict[str, str]) -> None:
        self.fn = fn
        self.environ = environ

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.update(self.environ)
        from .report import apply_and_report

        apply_and_report()  # what ascend_patch.apply() does, from the layer that implements it
        return self.fn(*args, **kwargs)


def process_patches(settings: Settings) -> list[Patch]:
    def start_processes(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args and not isinstance(args[0], PatchedEntry):
            args = (PatchedEntry(args[0], settings.to_environ()), *args[1:])
        elif "fn" in kwargs and not isinstance(kwargs["fn"], PatchedEntry):
            kwargs["fn"] = PatchedEntry(kwargs["fn"], settings.to_environ())
        return wrapped(*args, **kwargs)

    return [Wrap("torch.multiprocessing.spawn:start_processes", "spawned workers apply ascend_patch before running",
                 wrapper=start_processes, count_calls=False)]
