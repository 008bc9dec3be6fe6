"""Child processes started with ``torch.multiprocessing.spawn`` or multiprocessing's ``spawn`` are patched too.

Spawned children are fresh interpreters: the worker function is wrapped in a
picklable entry point that applies ascend_patch (with the parent's settings)
before calling it. A child of multiprocessing's ``spawn`` start method (a ``Process``, a
``Manager``, a ``Pool``; megatron-core's torch_dist checkpoint writer starts one) first
re-imports the parent's main script, *before* anything it was given runs: its command
line applies ascend_patch with the parent's settings first, so that import finds what the
parent found (Megatron-LM's ``pretrain_gpt.py`` imports megatron-core modules that need the
patch to import at all). Launchers that start their own Python children can rely on
``ASCEND_PATCH_AUTOLOAD=1`` instead (the installed ``.pth`` file honours it).
"""

from __future__ import annotations

import os
from typing import Any

from ..config import Settings
from ..patch import Patch, PatchKind

__all__ = ["PatchedEntry", "patched_command_line", "process_patches"]


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


def patched_command_line(command: list[Any], environ: dict[str, str]) -> list[Any]:
    """multiprocessing's spawn command line with ascend_patch applied before ``spawn_main`` runs."""
    if "-c" not in command:
        return command  # a frozen executable: no code to prefix
    at = command.index("-c") + 1
    prefix = (f"import os; os.environ.update({environ!r})\n"
              "try:\n import ascend_patch; ascend_patch.apply()\nexcept ImportError:\n pass\n")
    return [*command[:at], prefix + command[at], *command[at + 1:]]


def process_patches(settings: Settings) -> list[Patch]:
    def start_processes(original: Any) -> Any:
        def start(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(fn, PatchedEntry):
                fn = PatchedEntry(fn, settings.to_environ())
            return original(fn, *args, **kwargs)

        start.__wrapped__ = original  # type: ignore[attr-defined]
        return start

    def command_line(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return patched_command_line(wrapped(*args, **kwargs), settings.to_environ())

    return [Patch("torch.multiprocessing.spawn:start_processes", PatchKind.REPLACE,
                  "spawned workers apply ascend_patch before running", make=start_processes,
                  count_calls=False),
            Patch("multiprocessing.spawn:get_command_line", PatchKind.WRAP,
                  "multiprocessing's spawn children apply ascend_patch before re-importing the main script",
                  wrapper=command_line, count_calls=False)]
