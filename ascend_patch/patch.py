"""The :class:`Patch` record: data only, so any module can declare patches.

``ops/``, ``comm/``, ``models/`` and third-party plugins build these records and
hand them to the registry in ``ascend_patch_register_patches``; they never import
the patch manager, which lives in ``adaptors/``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Patch", "PatchKind", "Action", "TARGETS_ALL"]

TARGETS_ALL = frozenset({"npu", "cpu"})


class PatchKind(str, enum.Enum):
    """How a patch changes its target. Always stated, never guessed from a name."""

    REPLACE = "replace"  # the attribute becomes `replacement` (or `make(original)`)
    WRAP = "wrap"  # the attribute becomes wrapt.FunctionWrapper(original, wrapper)
    ADD = "add"  # a missing attribute is added (left alone when it exists)
    MODULE = "module"  # a shim module importable under `target` while the real one is missing
    ENV = "env"  # environment variable `target` is set to make(current value) (None: untouched)


class Action(str, enum.Enum):
    """What a patched call does, as the migration report says it."""

    TRANSLATED = "translated"  # the same operation on the target (cuda:1 -> npu:1)
    EMULATED = "emulated"  # an equivalent built for the target (events timed on the host)
    NOOP = "no-op"  # nothing to do on the target (synchronize on the host)
    UNSUPPORTED = "unsupported"  # raises an error naming the API and the target


@dataclass(frozen=True)
class Patch:
    """One change to one target.

    ``target`` is ``"module:attr.path"`` (``"torch.cuda:set_device"``,
    ``"torch:Tensor.cuda"``); for MODULE it is the module name, for ENV the
    variable name. ``versions`` is a PEP 440 specifier checked against the
    installed version of distribution ``package`` when the patch is applied; out
    of range, the patch is skipped with that reason.
    """

    target: str
    kind: PatchKind
    reason: str
    replacement: Any = None
    make: Callable[[Any], Any] | None = None
    wrapper: Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any] | None = None
    backends: frozenset[str] = TARGETS_ALL
    package: str | None = None
    versions: str | None = None
    action: Action = Action.TRANSLATED
    api: str | None = None  # the name the report shows (default: the target)
    count_calls: bool = True  # every call is a use of a CUDA API (False: the patch counts itself)
    # MODULE only: top-level packages whose code never gets this shim (to them the package
    # stays missing), e.g. megatron-core, which reads an importable transformer_engine as a full TE
    hidden_from: tuple[str, ...] = ()
    # Re-bind by-value copies of the original in other modules. False when the original is a
    # shared object whose other references are not copies of this attribute (megatron's
    # `jit_fuser` *is* `torch.compile`: re-binding would change torch.compile everywhere).
    rebind: bool = True
    owner: str = field(default="", compare=False)  # set by the registry: the plugin's name

    def __post_init__(self) -> None:
        kind = self.kind
        if not isinstance(kind, PatchKind):
            raise TypeError(f"Patch.kind must be a PatchKind, got {kind!r}")
        if kind in (PatchKind.REPLACE, PatchKind.ADD, PatchKind.MODULE):
            if (self.replacement is None) == (self.make is None):
                raise ValueError(f"{kind.value} patch {self.target!r} needs exactly one of replacement= or make=")
        if kind is PatchKind.WRAP and self.wrapper is None:
            raise ValueError(f"wrap patch {self.target!r} needs wrapper=")
        if kind is PatchKind.ENV and self.make is None:
            raise ValueError(f"env patch {self.target!r} needs make=")
        if kind in (PatchKind.REPLACE, PatchKind.ADD, PatchKind.WRAP) and ":" not in self.target:
            raise ValueError(f"patch target {self.target!r} must be 'module:attribute.path'")
        if self.hidden_from and kind is not PatchKind.MODULE:
            raise ValueError(f"patch {self.target!r}: hidden_from= is for MODULE patches only")
        if (self.package is None) != (self.versions is None):
            raise ValueError(f"patch {self.target!r}: package= and versions= go together")

    @property
    def module(self) -> str:
        """The module whose import the patch waits for."""
        return self.target.split(":", 1)[0]

    @property
    def attribute(self) -> str:
        return self.target.split(":", 1)[1] if ":" in self.target else ""

    @property
    def shown_as(self) -> str:
        return self.api or self.target.replace(":", ".")

    def build(self, original: Any) -> Any:
        """The new value for REPLACE/ADD/MODULE/ENV patches."""
        return self.make(original) if self.make is not None else self.replacement
