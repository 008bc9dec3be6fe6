"""Shim module objects: stand-ins for CUDA-only packages that are not installed.

``ops/`` builds these (data only); the patch manager's finder (``adaptors/shims.py``)
serves them. A name a shim does not provide raises :class:`ShimMissing` naming the
API and what to use instead; it is an AttributeError, so ``hasattr`` probes work.
Under ``from shim import name`` (where Python would replace an AttributeError by a
bare "cannot import name") it raises :class:`ShimImportError` with the same message,
which ``except ImportError`` fallbacks catch.

A builder may set ``__ascend_patch_init__`` (a callable taking the module) on the
module it returns; the finder calls it once the module is in ``sys.modules``, which
is where a package's ``__init__`` would import its own submodules.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Any
from .errors import AscendPatchError

__all__ = ["SHIM_INIT", "SHIM_MARK", "ShimImportError", "ShimMissing", "ShimModule", "is_shim"]

SHIM_MARK = "__ascend_patch_shim__"
SHIM_INIT = "__ascend_patch_init__"
_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


class ShimMissing(AscendPatchError, AttributeError):
    """The shim does not provide this name (an AttributeError, so ``hasattr`` probes still work)."""


class ShimImportError(AscendPatchError, ImportError):
    """``from shim import name`` for a name the shim does not provide (same message as ShimMissing)."""


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
