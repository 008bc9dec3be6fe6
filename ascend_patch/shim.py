"""Shim modules: stand-ins for CUDA-only packages that are not installed, declared as data and built from it."""

from __future__ import annotations

import dis
import importlib
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import AscendPatchError

__all__ = [
    "SHIM_INIT",
    "SHIM_MARK",
    "Renamed",
    "ShimBuilder",
    "ShimImportError",
    "ShimMissing",
    "ShimModule",
    "ShimSpec",
    "ShimTable",
    "is_shim",
    "resolve_path",
    "shim_markdown",
    "table_rows",
    "update_shim_tables",
]

SHIM_MARK = "__ascend_patch_shim__"
# A builder may set this (a callable taking the module) on the module it returns; the finder
# (patching/shim_finder.py) calls it once the module is in sys.modules, which is where a
# package's __init__ imports its own submodules.
SHIM_INIT = "__ascend_patch_init__"
_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


class ShimMissing(AscendPatchError, AttributeError):
    """The shim does not provide this name (an AttributeError, so ``hasattr`` probes still work)."""


class ShimImportError(AscendPatchError, ImportError):
    """``from shim import name`` for a name the shim does not provide (same message as ShimMissing).

    Python would turn an AttributeError there into a bare "cannot import name"; this one keeps the
    message, and ``except ImportError`` fallbacks still catch it.
    """


def _caller_is_import_from(depth: int) -> bool:
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) and code[at] == _IMPORT_FROM


class ShimModule(types.ModuleType):
    """A shim module. ``hints`` maps missing names to what to use instead (``"*"``: any other name)."""

    def __init__(self, name: str, doc: str = "", hints: dict[str, str] | None = None) -> None:
        super().__init__(name, doc)
        setattr(self, SHIM_MARK, True)
        self.__ascend_patch_hints__ = dict(hints or {})

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        hints = self.__dict__.get("__ascend_patch_hints__", {})
        hint = hints.get(attr) or hints.get("*") or "use the real package on a CUDA machine"
        top = self.__name__.split(".")[0]
        message = (f"{self.__name__}.{attr} is not provided by ascend_patch's {top} shim "
                   f"({top} is not installed here); {hint}")
        if _caller_is_import_from(2):
            raise ShimImportError(message, name=self.__name__)
        raise ShimMissing(message)


def is_shim(module: Any) -> bool:
    return bool(getattr(module, "__dict__", {}).get(SHIM_MARK, False))


# -- the declaration ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Renamed:
    """A class served under the stock package's name: a subclass of ``target`` (a dotted path) named as the
    name it is provided under, in ``module`` (``__module__``), made once per apply."""

    target: str
    module: str


@dataclass(frozen=True)
class ShimSpec:
    """One shim module, as data.

    ``provides``: name -> what it maps to, the dotted path of our implementation
    (``"ascend_patch.ops.optim:ApexFusedAdam"``) or a :class:`Renamed` class; they are in ``__all__``.
    ``children``: submodules its import imports, as the real package's ``__init__`` does. ``hints``:
    a missing name -> what to use instead (``"*"``: any other). ``version``: its ``__version__``, the API
    level implemented (not an install).
    """

    doc: str
    provides: Mapping[str, str | Renamed] = field(default_factory=dict)
    children: tuple[str, ...] = ()
    hints: Mapping[str, str] = field(default_factory=dict)
    version: str | None = None


# One table per shimmed package: module name -> spec, parents before children.
ShimTable = Mapping[str, ShimSpec]


def resolve_path(path: str) -> Any:
    """The object at ``"package.module:attr.sub"`` (imports the module)."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class ShimBuilder:
    """Builds one table's modules for one apply: each provided object once, each module once.

    It is the ``make`` of the table's ``ModuleShim`` patches. Objects are shared within the apply
    (``apex.optimizers.FusedAdam is apex.optimizers.fused_adam.FusedAdam``), and a patch can hand
    a module to code that never imports it (:meth:`module`: the object an import then finds too).
    """

    def __init__(self, table: ShimTable) -> None:
        self.table = table
        self._objects: dict[Any, Any] = {}
        self._modules: dict[str, ShimModule] = {}

    def __call__(self, name: str) -> ShimModule:
        """The module served under ``name``; the finder then imports its children."""
        module = self.module(name)
        if self.spec(name).children:
            setattr(module, SHIM_INIT, self._import_children)
        return module

    def spec(self, name: str) -> ShimSpec:
        spec = self.table.get(name)
        if spec is None:
            raise KeyError(f"no shim module called {name!r}; known: {', '.join(self.table)}")
        return spec

    def module(self, name: str) -> ShimModule:
        """The module ``name`` of this apply (built on first use, with its children as attributes)."""
        module = self._modules.get(name)
        if module is not None:
            return module
        spec = self.spec(name)
        module = self._modules[name] = ShimModule(name, f"ascend_patch shim for {name}: {spec.doc}", dict(spec.hints))
        for attr, target in spec.provides.items():
            setattr(module, attr, self.resolve(attr, target))
        module.__all__ = sorted(spec.provides)
        if spec.version is not None:
            module.__version__ = spec.version
        for child in spec.children:
            setattr(module, child, self.module(f"{name}.{child}"))
        return module

    def resolve(self, name: str, target: str | Renamed) -> Any:
        """The object ``name`` maps to (one per target, or per renamed class, in this apply)."""
        key = (name, target) if isinstance(target, Renamed) else target
        if key not in self._objects:
            if isinstance(target, Renamed):
                base = resolve_path(target.target)
                self._objects[key] = type(base)(name, (base,), {"__module__": target.module, "__qualname__": name})
            else:
                self._objects[key] = resolve_path(target)
        return self._objects[key]

    def _import_children(self, module: types.ModuleType) -> None:
        for child in self.spec(module.__name__).children:
            importlib.import_module(f"{module.__name__}.{child}")


# -- listing the tables (ascend-patch report --shims, and the docs) ------------------------------

def table_rows(table: ShimTable, code: Callable[[str], str] = str) -> list[tuple[str, str, str]]:
    """(module, name, what it maps to) for everything a table's modules offer; ``code`` marks up names and paths."""
    rows = []
    for module, spec in table.items():
        if spec.version is not None:
            version = f"{code(repr(spec.version))} (the API level implemented, not an install)"
            rows.append((module, "__version__", version))
        for name, target in spec.provides.items():
            shown = (f"{code(target.target)} as {code(f'{target.module}.{name}')}" if isinstance(target, Renamed)
                     else code(target))
            rows.append((module, name, shown))
        rows += [(module, child, f"submodule {code(f'{module}.{child}')}, imported with it") for child in spec.children]
        if not spec.provides and not spec.children:
            rows.append((module, "", spec.doc))
    return rows


def shim_markdown(tables: Mapping[str, ShimTable], packages: Iterable[str]) -> str:
    """The markdown table of ``packages``' shims (the docs' copy: regenerated, never edited by hand)."""
    def code(text: str) -> str:
        return f"`{text}`"

    lines = ["| shim module | name | maps to |", "|---|---|---|"]
    for package in packages:
        if package not in tables:
            raise KeyError(f"no shim table for {package!r}; known: {', '.join(sorted(tables))}")
        for module, name, target in table_rows(tables[package], code):
            lines.append(f"| `{module}` | {code(name) if name else ''} | {target} |")
    return "\n".join(lines)


_BLOCK = re.compile(r"(<!-- shim-tables: ([\w ]+) -->\n)(.*?)(<!-- /shim-tables -->)", re.S)


def update_shim_tables(text: str, render: Callable[[list[str]], str]) -> str:
    """``text`` with each ``<!-- shim-tables: pkg ... -->`` block holding ``render(packages)``."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{render(m.group(2).split())}\n{m.group(4)}", text)
