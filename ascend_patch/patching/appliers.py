"""The appliers, found by the record's type (the manager never asks a record for a kind)."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Protocol

from ..patch import Add, EnvVar, ModuleShim, Patch, Replace, Wrap
from .attributes import AddValue, AttributeApplier, ReplaceValue, WrapValue
from .shim_finder import ShimFinder, is_shim
from .status import ApplyContext, PatchStatus

__all__ = ["Applier", "EnvApplier", "ShimApplier", "applier_for"]


class Applier(Protocol):
    """What the manager asks of an applier. Environment variables are the exception to per-applier undo
    entries: they are written through the environment transaction the manager shares with backend
    selection, and restored with it."""

    def waits_for(self, patch: Any) -> str | None:
        """The module whose import the patch waits for, or None to apply it now."""
        ...

    def apply(self, statuses: list[PatchStatus], ctx: ApplyContext) -> list[Any]:
        """Apply the patches of ``statuses`` (recording each outcome); returns undo entries."""
        ...

    def undo(self, entries: list[Any]) -> None:
        """Undo ``entries`` (newest first)."""
        ...


class ShimApplier:
    """ModuleShim: served by a finder at the end of ``sys.meta_path`` while the real package is missing."""

    def waits_for(self, patch: ModuleShim) -> str | None:
        return None  # a shim is what the import finds: it cannot wait for it

    def apply(self, statuses: list[PatchStatus], ctx: ApplyContext) -> list[ShimFinder]:
        finder = ShimFinder()
        for status in statuses:
            patch = status.patch
            assert isinstance(patch, ModuleShim)
            top = patch.target.split(".")[0]
            if _real_package(top):
                status.state, status.detail = "skipped", f"{top} is installed; the real package is used"
                continue
            finder.add(patch.target, patch.build, patch.hidden_from)
            status.state, status.detail = "applied", f"shim served while {top} is not installed"
            if patch.hidden_from:
                status.detail += f"; not to {', '.join(patch.hidden_from)}"
        if not finder.names():
            return []
        finder.install()
        return [finder]

    def undo(self, entries: list[ShimFinder]) -> None:
        for finder in entries:
            finder.uninstall()


def _real_package(top: str) -> bool:
    loaded = sys.modules.get(top)
    if loaded is not None:
        return not is_shim(loaded)
    try:
        return importlib.util.find_spec(top) is not None  # our finder is not on meta_path yet
    except (ImportError, ValueError):
        return False


class EnvApplier:
    """EnvVar: the variable is set through the environment transaction (which is its undo record)."""

    def waits_for(self, patch: EnvVar) -> str | None:
        return None

    def apply(self, statuses: list[PatchStatus], ctx: ApplyContext) -> list[Any]:
        for status in statuses:
            patch = status.patch
            assert isinstance(patch, EnvVar)
            name = patch.target
            if name in ctx.env:  # carried over by `import ascend_patch` or backend selection
                status.state = "applied"
                status.detail = f"{name}={os.environ.get(name)} (set before torch_npu was imported)"
                continue
            before = os.environ.get(name)
            value = patch.build(before)
            if value is None or value == before:
                status.state, status.detail = "skipped", "nothing to set"
                continue
            ctx.env.set(name, value)
            status.state, status.detail = "applied", f"{name}={value}"
        return []

    def undo(self, entries: list[Any]) -> None:
        return None  # the manager restores the transaction


_ATTRIBUTES = AttributeApplier({Replace: ReplaceValue(), Add: AddValue(), Wrap: WrapValue()})
_APPLIERS: dict[type, Applier] = {
    Replace: _ATTRIBUTES,
    Add: _ATTRIBUTES,
    Wrap: _ATTRIBUTES,
    ModuleShim: ShimApplier(),
    EnvVar: EnvApplier(),
}


def applier_for(patch: Patch) -> Applier:
    """The applier of ``patch``'s record type (or of the nearest base it derives from)."""
    applier = _APPLIERS.get(type(patch))
    if applier is not None:
        return applier
    for cls in type(patch).__mro__:
        applier = _APPLIERS.get(cls)
        if applier is not None:
            return applier
    raise TypeError(f"{type(patch).__name__} is not a patch record type the manager knows "
                    "(Replace, Wrap, Add, ModuleShim, EnvVar)")
