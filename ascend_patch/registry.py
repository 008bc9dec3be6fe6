"""One registry of named things, with the rule every registry here follows.

A name (or alias) belongs to one object: claiming it for another raises
:class:`DuplicateName` naming both sides and the plugins they came from; an unknown
name raises the registry's own ``LookupError`` listing the known ones. Lookups are
case-insensitive; a registry may normalise further (model specs also ignore ``-``,
``_`` and ``.``, so ``qwen2.5``, ``Qwen2_5`` and ``qwen25`` are one name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from .errors import AscendPatchError

__all__ = ["DuplicateName", "NamedRegistry", "RegistryError", "UnknownName", "loose_key"]

T = TypeVar("T")


class RegistryError(AscendPatchError, ValueError):
    """An object a plugin registers that a registry cannot hold (it has no name, or a taken one)."""


class DuplicateName(RegistryError):
    """Two objects claim one name."""


class UnknownName(AscendPatchError, LookupError):
    """A name no one registered (registries raise a subclass naming what they hold)."""


def loose_key(name: str) -> str:
    """``"Qwen2.5"`` / ``"qwen2_5"`` / ``"qwen-25"`` -> ``"qwen25"``: the key of a registry that ignores punctuation."""
    return "".join(c for c in name.lower() if c not in "-_.")


class NamedRegistry(Generic[T]):
    """Objects by name and alias.

    ``what`` names the kind in messages ("model spec", "checkpoint loader"); ``hint``
    ends the unknown-name message (how to add one); ``unknown`` is the LookupError
    subclass raised for an unknown name; ``key`` turns a name into its lookup key.
    """

    def __init__(self, what: str, *, hint: str = "", unknown: type[LookupError] = UnknownName,
                 key: Callable[[str], str] = str.lower, listing: Callable[[NamedRegistry[T]], str] | None = None):
        self.what, self.hint, self.unknown, self.key = what, hint, unknown, key
        self._listing = listing
        self._by_key: dict[str, tuple[T, str, str]] = {}  # key -> (object, owner, how messages name it)
        self._primary: dict[int, str] = {}  # id(object) -> its own name

    def add(self, obj: T, name: str, aliases: Iterable[str] = (), owner: str = "", label: str | None = None) -> None:
        """Register ``obj`` under ``name`` and ``aliases`` (a name it already holds is accepted again)."""
        if not name:
            raise RegistryError(f"{self.what} {obj!r} from plugin {owner or '?'} has no name")
        label = label or name
        for alias in (name, *aliases):
            key = self.key(alias)
            existing = self._by_key.get(key)
            if existing is not None and existing[0] is not obj:
                raise DuplicateName(f"{self.what} name {alias!r} is claimed by plugin {existing[1] or '?'} "
                                    f"({existing[2]}) and by plugin {owner or '?'} ({label})")
        for alias in (name, *aliases):
            self._by_key.setdefault(self.key(alias), (obj, owner, label))
        self._primary.setdefault(id(obj), name)

    def alias(self, name: str, target: str, owner: str = "") -> None:
        """Make ``name`` one more name of the object ``target`` names (declared by plugin ``owner``)."""
        obj, obj_owner, label = self._entry(target)
        existing = self._by_key.get(self.key(name))
        if existing is not None and existing[0] is not obj:
            raise DuplicateName(f"{self.what} name {name!r} is claimed by plugin {existing[1] or '?'} "
                                f"({existing[2]}) and by plugin {owner or '?'} (an alias of {label})")
        self._by_key.setdefault(self.key(name), (obj, obj_owner, label))

    def _entry(self, name: str) -> tuple[T, str, str]:
        hit = self._by_key.get(self.key(name))
        if hit is None:
            text = f"unknown {self.what} {name!r}; known: {self.listing()}"
            raise self.unknown(f"{text}. {self.hint}" if self.hint else text)
        return hit

    def get(self, name: str) -> T:
        """The object ``name`` names; an unknown name raises ``self.unknown`` listing the known ones."""
        return self._entry(name)[0]

    def find(self, name: str) -> T | None:
        """The object ``name`` names, or None."""
        hit = self._by_key.get(self.key(name))
        return hit[0] if hit else None

    def owner_of(self, name: str) -> str:
        """The plugin that registered the object ``name`` names ('' when unknown)."""
        hit = self._by_key.get(self.key(name))
        return hit[1] if hit else ""

    def names_of(self, obj: T) -> list[str]:
        """Every key under which ``obj`` is registered (its own name's first)."""
        own = self.key(self._primary.get(id(obj), ""))
        keys = [k for k, (o, _, _) in self._by_key.items() if o is obj]
        return sorted(keys, key=lambda k: (k != own, k))

    def __iter__(self) -> Iterator[T]:
        """Each object once, by its own name."""
        seen: dict[int, T] = {}
        for obj, _, _ in self._by_key.values():
            seen.setdefault(id(obj), obj)
        return iter(sorted(seen.values(), key=lambda o: self._primary.get(id(o), "")))

    def names(self) -> list[str]:
        """The objects' own names, sorted."""
        return sorted(self._primary.get(id(o), "") for o in self)

    def listing(self) -> str:
        """The known names as the unknown-name message shows them."""
        if self._listing is not None:
            return self._listing(self)
        return ", ".join(self.names()) or "none"
