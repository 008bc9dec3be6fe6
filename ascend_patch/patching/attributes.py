"""The applier of the attribute patches (Replace, Add, Wrap): install, undo by identity, no double wrap."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any

import wrapt

from ..patch import Add, AttributePatch, Replace, Wrap
from ..usage import UsageRecorder
from .rebind import has_identity, own_dict, rebind_copies, restore_copies
from .status import ApplyContext, PatchStatus, skip

__all__ = ["MISSING", "AddValue", "AttributeApplier", "AttributeUndo", "ReplaceValue", "WrapValue", "counted"]

MISSING: Any = object()  # an attribute that is not there
# id -> (replacement, the patch that installed it, what it replaced) for every replacement installed now
# (kept alive so ids stay unique). A patch finds itself down this chain at its target when it is
# applied already, which is what stops double wrapping while two different wraps still compose.
_LIVE: dict[int, tuple[Any, AttributePatch, Any]] = {}


def _installed(patch: AttributePatch, current: Any) -> bool:
    """Whether ``current`` is ours already for ``patch``: installed by it (or an equal record), or, for a
    wrap, by a patch of another target (an alias or a re-bound copy of it: wrapped once), or wrapping such
    a value. Another wrap of the same target is not: that one composes. A replacement replaces whatever
    another patch put there (megatron's ``jit_fuser`` holds the wrapped ``torch.compile``, and becomes eager)."""
    wraps = isinstance(patch, Wrap)
    while has_identity(current) and id(current) in _LIVE:
        _, by, replaced = _LIVE[id(current)]
        if by == patch or (wraps and by.target != patch.target):
            return True
        current = replaced
    return False


@dataclass(eq=False)  # compared by identity; no generated __eq__ to build at import
class AttributeUndo:
    """One applied attribute patch: what to put back, where, and the copies re-bound."""

    status: PatchStatus
    owner: Any
    name: str
    had_own: bool
    old: Any  # the owner's own value before (when had_own)
    original: Any  # what getattr returned before (for re-binding copies back)
    new: Any
    rebound: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)

    @property
    def rebinds(self) -> bool:
        patch = self.status.patch
        return isinstance(patch, AttributePatch) and patch.rebind

    def note_rebound(self, where: str) -> None:
        self.status.rebound.append(where)

    def undo(self) -> None:
        """Put the original back by identity, unless something else has replaced ours since."""
        if own_dict(self.owner).get(self.name, MISSING) is self.new:
            if self.had_own:
                setattr(self.owner, self.name, self.old)
            else:
                delattr(self.owner, self.name)


def resolve(patch: AttributePatch) -> tuple[Any, str, Any]:
    """(owner, attribute name, current value or MISSING) of an imported module's target.

    ``wrapt.resolve_path`` walks to the owner without binding (a class on the way is
    read from the ``__dict__`` along its MRO); the attribute itself is read with getattr,
    which is what a by-value copy of it holds (a staticmethod's function, say).
    """
    module = sys.modules.get(patch.module)
    prefix, _, name = patch.attribute.rpartition(".")
    owner = wrapt.resolve_path(module, prefix)[2] if prefix else module
    return owner, name, getattr(owner, name, MISSING)


class ReplaceValue:
    """How a Replace changes its target: the target must exist; it becomes ``build(original)``."""

    def unusable(self, patch: AttributePatch, current: Any) -> tuple[str, bool] | None:
        """(why, whether strict mode makes it fatal) when the current value rules the patch out."""
        if current is MISSING:
            return f"target missing: {patch.module} has no {patch.attribute}", True
        return None

    def new_value(self, patch: AttributePatch, own: Any, current: Any) -> Any:
        """What the attribute becomes; ``own`` is the owner's own value (else the inherited one)."""
        assert isinstance(patch, Replace)
        return patch.build(current)


class AddValue(ReplaceValue):
    """How an Add changes its target: only a missing one, which becomes ``build(None)``."""

    def unusable(self, patch: AttributePatch, current: Any) -> tuple[str, bool] | None:
        if current is not MISSING:
            return "already provided by the target", False
        return None

    def new_value(self, patch: AttributePatch, own: Any, current: Any) -> Any:
        assert isinstance(patch, Add)
        return patch.build(None)


class WrapValue(ReplaceValue):
    """How a Wrap changes its target: it becomes ``wrapt.FunctionWrapper(original, wrapper)``."""

    def new_value(self, patch: AttributePatch, own: Any, current: Any) -> Any:
        assert isinstance(patch, Wrap)
        return wrapt.FunctionWrapper(own, patch.wrapper)


class AttributeApplier:
    """Applies Replace, Add and Wrap patches once their module is imported.

    A target ``"module:attr.path"`` is resolved without binding (:func:`resolve`); every
    change is an :class:`AttributeUndo`; copies of each original are re-bound
    (``rebind.py``), and with reporting on, calls of the new value count as uses (:func:`counted`).

    One applier serves the three record types, so that a batch re-binds copies in one
    pass over ``sys.modules`` (and ``remove()`` puts them back in one); what differs
    between them is their ``changes`` entry (:class:`ReplaceValue` and its kin).
    """

    def __init__(self, changes: dict[type[AttributePatch], ReplaceValue]) -> None:
        self._changes = changes

    def _change(self, patch: AttributePatch) -> ReplaceValue:
        change = self._changes.get(type(patch))
        if change is not None:
            return change
        for cls in type(patch).__mro__:
            change = self._changes.get(cls)
            if change is not None:
                return change
        raise TypeError(f"no attribute change for {type(patch).__name__}")

    def waits_for(self, patch: AttributePatch) -> str | None:
        """The module to wait for, or None when it is imported already."""
        return None if patch.module in sys.modules else patch.module

    def apply(self, statuses: list[PatchStatus], ctx: ApplyContext) -> list[AttributeUndo]:
        """Apply each patch, then re-bind by-value copies of every original in one pass."""
        applied = [undo for status in statuses if (undo := self._apply_one(status, ctx)) is not None]
        rebind_copies(applied, MISSING)
        return applied

    def _apply_one(self, status: PatchStatus, ctx: ApplyContext) -> AttributeUndo | None:
        patch, strict = status.patch, ctx.strict
        assert isinstance(patch, AttributePatch)
        try:
            owner, name, current = resolve(patch)
        except AttributeError as exc:  # wrapt's PathResolutionError keeps getattr's error as its cause
            cause = exc.__cause__ if isinstance(exc.__cause__, AttributeError) else exc
            skip(status, f"target missing: {cause}", strict)
            return None
        change = self._change(patch)
        unusable = change.unusable(patch, current)
        if unusable is not None:
            why, fatal = unusable
            skip(status, why, strict and fatal)
            return None
        if current is not MISSING and _installed(patch, current):
            status.state, status.detail = "skipped", "already patched (no double wrapping)"
            return None
        own = own_dict(owner)
        had_own = name in own
        old = own.get(name, MISSING) if had_own else MISSING
        try:
            new = counted(patch, change.new_value(patch, old if had_own else current, current), ctx.recorder)
            setattr(owner, name, new)
        except Exception as exc:
            skip(status, f"failed: {type(exc).__name__}: {exc}", strict, state="failed")
            return None
        status.state, status.detail = "applied", ""
        if has_identity(new):
            _LIVE[id(new)] = (new, patch, current)
        return AttributeUndo(status, owner, name, had_own, old, current, new)

    def undo(self, entries: list[AttributeUndo]) -> None:
        """Restore every original (``entries`` newest first), then the copies of each."""
        for entry in entries:
            entry.undo()
        restore_copies(entries, MISSING)
        for entry in entries:
            _LIVE.pop(id(entry.new), None)


def counted(patch: AttributePatch, new: Any, recorder: UsageRecorder | None) -> Any:
    """``new``, made to record each call with ``recorder`` (``new`` itself when there is nothing to count).

    With reporting off (no recorder) the replacement is installed as it is: the hot path
    pays nothing.
    """
    if recorder is None or not patch.count_calls:
        return new
    api, action = patch.shown_as, patch.action.value
    if isinstance(new, type):
        init = new.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            recorder.hit(api, action)
            init(self, *args, **kwargs)

        return type(new.__name__, (new,), {"__init__": __init__, "__module__": new.__module__,
                                           "__qualname__": new.__qualname__})
    if isinstance(new, property) and new.fget is not None:
        fget = new.fget

        def counted_get(self: Any) -> Any:
            recorder.hit(api, action)
            return fget(self)

        return property(counted_get, new.fset, new.fdel, new.__doc__)
    if callable(new) and not isinstance(new, (staticmethod, classmethod)):
        target = new

        # name, docstring and __wrapped__ of the replacement, nothing else (its __dict__ may hold
        # markers such as torch.compile's, which must not move onto the counting wrapper)
        @functools.wraps(new, assigned=("__name__", "__doc__"), updated=())
        def counted_call(*args: Any, **kwargs: Any) -> Any:
            recorder.hit(api, action)
            return target(*args, **kwargs)

        if not hasattr(new, "__name__"):
            counted_call.__name__ = "counted"
        return counted_call
    return new
