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
from ..patch import Patch, Replace

__all__ = ["PatchedEntry", "process_patches"]


class PatchedEntry:
    """``fn`` run in a child after ascend_patch is applied there with the parent's settings."""

    def __init__(self, fn: Any, environ: dict[str, str]) -> None:
        self.fn = fn
        self.environ = environ

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.update(self.environ)
        import ascend_patch

        ascend_patch.apply()
        return self.fn(*args, **kwargs)


def process_patches(settings: Settings) -> list[Patch]:
    def start_processes(original: Any) -> Any:
        def start(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(fn, PatchedEntry):
                fn = PatchedEntry(fn, settings.to_environ())
            return original(fn, *args, **kwargs)

        start.__wrapped__ = original  # type: ignore[attr-defined]
        return start

    return [Replace("torch.multiprocessing.spawn:start_processes",
                    "spawned workers apply ascend_patch before running", make=start_processes,
                    count_calls=False)]
