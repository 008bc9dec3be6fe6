"""By-value copies of a patched attribute in other modules: re-bound on apply, put back on remove."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

__all__ = ["Rebindable", "has_identity", "module_dicts", "own_dict", "rebind_copies", "restore_copies"]

_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes)


class Rebindable(Protocol):
    """An applied attribute patch, as re-binding sees it (see ``attributes.AttributeUndo``)."""

    owner: Any
    name: str  # the attribute patched on owner
    original: Any  # what the attribute held before (MISSING when it was added)
    new: Any
    rebound: list[tuple[dict[str, Any], str, Any]]  # (namespace, key, the value put there)

    @property
    def rebinds(self) -> bool: ...

    def note_rebound(self, where: str) -> None: ...


def has_identity(obj: Any) -> bool:
    """Whether "the same object" means "a copy of this attribute": true for functions, classes,
    descriptors and modules only. Plain values (None, numbers, strings, and containers such as
    the empty tuple, which Python shares between unrelated places) say nothing about where they
    came from; re-binding every ``()`` in every module would be a disaster."""
    if isinstance(obj, _VALUE_TYPES):
        return False
    return callable(obj) or isinstance(obj, (property, staticmethod, classmethod, types.ModuleType))


def own_dict(owner: Any) -> dict[str, Any] | Any:
    """``vars(owner)``, or an empty dict for objects without one."""
    try:
        return vars(owner)
    except TypeError:
        return {}


def module_dicts() -> list[tuple[str, dict[str, Any]]]:
    """(name, namespace) of every imported module but ours."""
    out = []
    for name, module in list(sys.modules.items()):
        if module is None or name.startswith("ascend_patch"):
            continue
        d = getattr(module, "__dict__", None)
        if isinstance(d, dict):
            out.append((name, d))
    return out


def _holding(values: dict[int, Rebindable]) -> Iterator[tuple[str, dict[str, Any], str, Rebindable]]:
    """(module name, namespace, key, patch) for every module global whose value's id is in ``values``."""
    for mod_name, d in module_dicts():
        # set arithmetic in C first: most modules hold none of the values
        if values.keys().isdisjoint(map(id, d.values())):
            continue
        for key, value in list(d.items()):
            undo = values.get(id(value))
            if undo is not None:
                yield mod_name, d, key, undo


def rebind_copies(applied: Iterable[Rebindable], missing: object) -> None:
    """Point by-value copies of each original (in every imported module) at the new value."""
    originals = {id(u.original): u for u in applied
                 if u.original is not missing and u.rebinds and has_identity(u.original)}
    if not originals:
        return
    for mod_name, d, key, undo in _holding(originals):
        if d[key] is not undo.original or d is own_dict(undo.owner):
            continue
        new = undo.new
        while id(new) in originals and originals[id(new)] is not undo:  # wraps of one target: the outermost
            new = originals[id(new)].new
        d[key] = new
        undo.rebound.append((d, key, new))
        undo.note_rebound(f"{mod_name}.{key}")


def restore_copies(removed: Iterable[Rebindable], missing: object) -> None:
    """Point re-bound copies back at the original, and copies of a replacement made while patched.

    A copy of what an Add patch added (there was no original) is left as it is. For a patch
    that does not re-bind (its original is a shared object, such as megatron's ``jit_fuser``,
    which *is* ``torch.compile``), only copies under the patched attribute's own name count:
    ``from megatron.core.jit import jit_fuser`` in a module imported while patched.
    """
    removed = list(removed)
    for undo in removed:
        for d, key, value in undo.rebound:
            if d.get(key) is value:
                d[key] = undo.original
    replaced = {id(u.new): u for u in removed if u.original is not missing and has_identity(u.new)}
    if not replaced:
        return
    for _, d, key, undo in _holding(replaced):
        if d[key] is undo.new and d is not own_dict(undo.owner) and (undo.rebinds or key == undo.name):
            original = undo.original
            while id(original) in replaced and replaced[id(original)] is not undo:  # a wrap of a wrap
                original = replaced[id(original)].original
            d[key] = original
