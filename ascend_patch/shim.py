"""Shim module objects: stand-ins for CUDA-only packages that are not installed.

``ops/`` builds these (data only); the patch manager's finder (``adaptors/shims.py``)
serves them. A name a shim does not provide raises :class:`ShimMissing` naming the
API and what to use instead; it is an AttributeError, so ``hasattr`` probes work.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["SHIM_MARK", "ShimMissing", "ShimModule", "is_shim"]

SHIM_MARK = "__ascend_patch_shim__"


class ShimMissing(AttributeError):
    """The shim does not provide this name (an AttributeError, so ``hasattr`` probes still work)."""


class ShimModule(types.ModuleType):
    """A shim module. ``hints`` maps missing names to what to use instead."""

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
        raise ShimMissing(
            f"{self.__name__}.{attr} is not provided by ascend_patch's {top} shim "
            f"({top} is not installed here); {hint}"
        )


def is_shim(module: Any) -> bool:
    return bool(getattr(module, "__dict__", {}).get(SHIM_MARK, False))
