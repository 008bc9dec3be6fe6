"""Checkpoint conversion: loaders and savers (plugins), the streaming engine, preflight, verify.

``from ascend_patch.loaders import convert`` is the entry point; the submodules are
imported on first use so that the plugin module stays cheap to import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["convert", "verify", "ConvertOptions", "PreflightError"]


def __getattr__(name: str) -> Any:
    if name == "convert":
        from .engine import convert

        return convert
    if name == "verify":
        from .verify import verify

        return verify
    if name == "ConvertOptions":
        from .formats import ConvertOptions

        return ConvertOptions
    if name == "PreflightError":
        from .preflight import PreflightError

        return PreflightError
    raise AttributeError(name)
