"""Shim modules: importable stand-ins for CUDA-only packages that are not installed."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from ..shim import SHIM_INIT, SHIM_MARK, ShimMissing, ShimModule, is_shim

__all__ = ["ShimFinder", "ShimMissing", "ShimModule", "importer_module", "is_shim"]

_IMPORT_MACHINERY = ("importlib", "_frozen_importlib", "wrapt", "ascend_patch")


def importer_module(depth: int = 1) -> str:
    """``__name__`` of the module whose code runs the current import (import machinery skipped)."""
    frame: Any = sys._getframe(depth)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_IMPORT_MACHINERY):
            return name
        frame = frame.f_back
    return ""


def _top(name: str) -> str:
    return name.partition(".")[0]


class _ShimLoader(importlib.abc.Loader):
    def __init__(self, build: Callable[[str], types.ModuleType]) -> None:
        self._build = build

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self._build(spec.name)
        setattr(module, SHIM_MARK, True)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if not hasattr(module, "__path__"):
            module.__path__ = []  # every shim can hold shim submodules
        init = module.__dict__.pop(SHIM_INIT, None)
        if init is not None:
            init(module)  # in sys.modules now: the place a package __init__ imports its submodules


class _HiddenGuard(importlib.abc.MetaPathFinder):
    """Finds nothing; when a package a shim is hidden from imports, drops cached copies of that shim."""

    def __init__(self, owner: ShimFinder) -> None:
        self._owner = owner

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if _top(fullname) in self._owner.hiding:
            self._owner.drop_cached_for(_top(fullname))
        return None


class ShimFinder(importlib.abc.MetaPathFinder):
    """Serves registered shims for module names no other finder could find.

    It sits at the *end* of ``sys.meta_path``, so an installed package is always found first.
    A shim's spec says what it is (``find_spec("flash_attn").origin`` names ascend_patch), a
    name it lacks raises :class:`ShimMissing` naming the API and what to use instead, and
    :meth:`uninstall` removes every shim module. A shim hidden from some packages
    (``ModuleShim.hidden_from``) is not found by their imports, and a guard at the *front* of
    ``sys.meta_path`` drops cached copies whenever one of them starts importing, so a shim
    user code imported earlier does not leak to them.
    """

    def __init__(self) -> None:
        self._builders: dict[str, Callable[[str], types.ModuleType]] = {}
        self._hidden: dict[str, frozenset[str]] = {}  # shim name -> packages it is hidden from
        self.hiding: set[str] = set()
        self._guard = _HiddenGuard(self)

    def add(self, name: str, build: Callable[[str], types.ModuleType], hidden_from: Iterable[str] = ()) -> None:
        self._builders[name] = build
        hidden = frozenset(hidden_from)
        if hidden:
            self._hidden[name] = hidden
            self.hiding |= hidden

    def names(self) -> list[str]:
        return sorted(self._builders)

    def drop_cached_for(self, package: str) -> list[str]:
        """Remove from sys.modules the cached shims hidden from ``package``; returns their names."""
        dropped = [n for n, hidden in self._hidden.items() if package in hidden and is_shim(sys.modules.get(n))]
        for name in dropped:
            del sys.modules[name]
        return dropped

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        build = self._builders.get(fullname)
        if build is None:
            return None
        parent = fullname.rpartition(".")[0]
        if parent and not is_shim(sys.modules.get(parent)):
            return None  # never graft a shim submodule into a real package
        hidden = self._hidden.get(fullname)
        if hidden and _top(importer_module(2)) in hidden:
            return None  # to this importer the package stays missing
        top = fullname.split(".")[0]
        spec = importlib.machinery.ModuleSpec(
            fullname, _ShimLoader(build),
            origin=f"ascend_patch shim ({top} is not installed)", is_package=True)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.append(self)
        if self.hiding and self._guard not in sys.meta_path:
            sys.meta_path.insert(0, self._guard)

    def uninstall(self) -> list[str]:
        """Remove the finder (and its guard) and every shim module it served; returns their names."""
        for finder in (self, self._guard):
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
        removed = [name for name, mod in list(sys.modules.items()) if is_shim(mod)]
        for name in removed:
            del sys.modules[name]
        for name in removed:  # a shim submodule is also an attribute of its parent shim
            parent, _, child = name.rpartition(".")
            if parent and parent in sys.modules and getattr(sys.modules[parent], child, None) is not None:
                try:
                    delattr(sys.modules[parent], child)
                except AttributeError:
                    pass
        return removed
