"""Shim modules: importable stand-ins for CUDA-only packages that are not installed.

A shim is served by a finder placed at the *end* of ``sys.meta_path``, so an
installed package is always found first and never shadowed. Its spec says what
it is (``importlib.util.find_spec("flash_attn").origin`` names ascend_patch), a
name the shim does not provide raises :class:`ShimMissing` naming the API and
what to use instead, and :meth:`ShimFinder.uninstall` removes every shim module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

from ..shim import SHIM_MARK, ShimMissing, ShimModule, is_shim

__all__ = ["ShimFinder", "ShimMissing", "ShimModule", "is_shim"]


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


class ShimFinder(importlib.abc.MetaPathFinder):
    """Serves registered shims for module names no other finder could find."""

    def __init__(self) -> None:
        self._builders: dict[str, Callable[[str], types.ModuleType]] = {}

    def add(self, name: str, build: Callable[[str], types.ModuleType]) -> None:
        self._builders[name] = build

    def names(self) -> list[str]:
        return sorted(self._builders)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        build = self._builders.get(fullname)
        if build is None:
            return None
        parent = fullname.rpartition(".")[0]
        if parent and not is_shim(sys.modules.get(parent)):
            return None  # never graft a shim submodule into a real package
        top = fullname.split(".")[0]
        spec = importlib.machinery.ModuleSpec(
            fullname, _ShimLoader(build),
            origin=f"ascend_patch shim ({top} is not installed)", is_package=True)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.append(self)

    def uninstall(self) -> list[str]:
        """Remove the finder and every shim module it served; returns their names."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
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
