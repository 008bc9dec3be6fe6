"""Patch records: data only, so any module can declare patches.

``ops/``, ``comm/``, ``models/`` and third-party plugins build these records and
hand them to the registry in ``ascend_patch_register_patches``; they never import
the patch manager, which lives in ``adaptors/``. One record type per way of changing
a target, each with only the fields it uses:

=============  ==============================================================
``Replace``    an attribute becomes ``replacement`` (or ``make(original)``)
``Wrap``       an attribute becomes ``wrapt.FunctionWrapper(original, wrapper)``
``Add``        a missing attribute is added (left alone when it exists)
``ModuleShim`` a module importable under ``target`` while the real one is missing
``EnvVar``     environment variable ``target`` is set to ``make(current value)``
=============  ==============================================================
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Action",
    "Add",
    "AttributePatch",
    "EnvVar",
    "ModuleShim",
    "Patch",
    "PatchKind",
    "Replace",
    "TARGETS_ALL",
    "Wrap",
    "replacing",
]

TARGETS_ALL = frozenset({"npu", "cpu"})

F = TypeVar("F", bound=Callable[..., Any])


class PatchKind(str, enum.Enum):
    """The name of each record type, as reports and tables show it."""

    REPLACE = "replace"
    WRAP = "wrap"
    ADD = "add"
    MODULE = "module"
    ENV = "env"


class Action(str, enum.Enum):
    """What a patched call does, as the migration report says it."""

    TRANSLATED = "translated"  # the same operation on the target (cuda:1 -> npu:1)
    EMULATED = "emulated"  # an equivalent built for the target (events timed on the host)
    NOOP = "no-op"  # nothing to do on the target (synchronize on the host)
    UNSUPPORTED = "unsupported"  # raises an error naming the API and the target


# Every method a dataclass generates is an exec when this module is imported, which every
# `import ascend_patch` does: the bases generate none but the frozen guards, the record types
# their __init__ too; equality, hashing and repr are written once, in Patch.
_BASE = dict(frozen=True, init=False, repr=False, eq=False)
_RECORD = dict(frozen=True, kw_only=True, repr=False, eq=False)


@dataclass(**_BASE)
class Patch:
    """What every patch record has: a target, the reason, the targets and versions it is for.

    ``package`` names the distribution whose version (as a plugin reports it, else its
    installed metadata) two optional PEP 440 ranges are checked against when the patch is
    applied: ``versions``, the range the patch was checked against (outside it the patch is
    skipped, fatal with ``ASCEND_PATCH_STRICT=1``), and ``needed``, the releases that need it
    (outside it the patch is "not needed", never fatal). Use one of the record types below.
    """

    kind: ClassVar[PatchKind]

    target: str
    reason: str
    _: KW_ONLY
    backends: frozenset[str] = TARGETS_ALL
    package: str | None = None
    versions: str | None = None
    needed: str | None = None
    action: Action = Action.TRANSLATED
    api: str | None = None  # the name the report shows (default: the target)
    owner: str = field(default="", compare=False)  # set by the registry: the plugin's name

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # the record types generate their own
        raise TypeError("Patch is the base of the record types: use Replace, Wrap, Add, ModuleShim or EnvVar")

    def __post_init__(self) -> None:
        if (self.package is None) != (self.versions is None and self.needed is None):
            raise ValueError(f"patch {self.target!r}: package= goes with versions= or needed=")

    @property
    def module(self) -> str:
        """The module whose import the patch waits for (for ModuleShim, the shim's name)."""
        return self.target.split(":", 1)[0]

    @property
    def attribute(self) -> str:
        return self.target.split(":", 1)[1] if ":" in self.target else ""

    @property
    def shown_as(self) -> str:
        return self.api or self.target.replace(":", ".")

    # -- equal by value (the owner aside), hashable, shown with its fields ------------------

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.compare)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}({shown})"


@dataclass(**_BASE, kw_only=True)
class AttributePatch(Patch):
    """A patch on ``"module:attr.path"`` (``"torch.cuda:set_device"``, ``"torch:Tensor.cuda"``).

    ``count_calls``: every call of the new value is a use of a CUDA API (False: the
    patch counts itself). ``rebind``: re-bind by-value copies of the original in other
    modules; False when the original is a shared object whose other references are not
    copies of this attribute (megatron's ``jit_fuser`` *is* ``torch.compile``).
    """

    count_calls: bool = True
    rebind: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if ":" not in self.target:
            raise ValueError(f"patch target {self.target!r} must be 'module:attribute.path'")


@dataclass(**_BASE, kw_only=True)
class _NewValue(AttributePatch):
    replacement: Any = None
    make: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.replacement is None) == (self.make is None):
            raise ValueError(f"{self.kind.value} patch {self.target!r} needs exactly one of replacement= or make=")

    def build(self, original: Any) -> Any:
        """The new value: ``make(original)``, or ``replacement``."""
        return self.make(original) if self.make is not None else self.replacement


@dataclass(**_RECORD)
class Replace(_NewValue):
    """The attribute becomes ``replacement``, or ``make(original)``."""

    kind: ClassVar[PatchKind] = PatchKind.REPLACE


@dataclass(**_RECORD)
class Add(_NewValue):
    """A missing attribute is added (``make`` receives None); one that exists is left alone."""

    kind: ClassVar[PatchKind] = PatchKind.ADD


@dataclass(**_RECORD)
class Wrap(AttributePatch):
    """The attribute becomes ``wrapt.FunctionWrapper(original, wrapper)``.

    ``wrapper(wrapped, instance, args, kwargs)`` has wrapt's signature.
    """

    kind: ClassVar[PatchKind] = PatchKind.WRAP

    wrapper: Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(**_RECORD)
class ModuleShim(Patch):
    """A shim module importable under ``target`` (a module name) while the real package is missing.

    ``make(name)`` builds the module. ``hidden_from``: top-level packages whose code
    never gets this shim (to them the package stays missing), e.g. megatron-core,
    which reads an importable transformer_engine as a full TE.
    """

    kind: ClassVar[PatchKind] = PatchKind.MODULE

    make: Callable[[str], types.ModuleType]
    hidden_from: tuple[str, ...] = ()

    def build(self, name: str) -> types.ModuleType:
        """The shim module served under ``name``."""
        return self.make(name)


@dataclass(**_RECORD)
class EnvVar(Patch):
    """Environment variable ``target`` is set to ``make(current value)`` (None: left untouched)."""

    kind: ClassVar[PatchKind] = PatchKind.ENV

    make: Callable[[str | None], str | None]

    def build(self, current: str | None) -> str | None:
        """The value to set, given the current one (None: leave the variable as it is)."""
        return self.make(current)


def replacing(original: Any) -> Callable[[F], F]:
    """Decorator for a replacement built around ``original`` (in a ``make(original)``).

    The replacement gets ``__wrapped__`` (``inspect.signature`` and ``inspect.unwrap``
    see the original) and, when it has no docstring of its own, the original's. Its
    name and module stay its own, so it still says where it comes from.
    """

    def mark(replacement: F) -> F:
        functools.update_wrapper(replacement, original, assigned=(), updated=())
        if replacement.__doc__ is None:
            doc = getattr(original, "__doc__", None)
            if isinstance(doc, str):
                replacement.__doc__ = doc
        return replacement

    return mark
