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

Shims are served once the patches are applied, which ``import ascend_patch`` defers to
``import torch``. :class:`TorchFirst` covers the order ``import ascend_patch`` then
``import transformer_engine``: a shimmed package that is not installed imports torch first,
as the real package would, and then finds its shim.
"""

from __future__ import annotations

import dis
import importlib.abc
import sys
import types
from typing import Any
from .errors import AscendPatchError

__all__ = ["SHIMMED_PACKAGES", "SHIM_INIT", "SHIM_MARK", "ShimImportError", "ShimMissing", "ShimModule",
           "TorchFirst", "is_shim"]

# the top-level packages a shim stands in for (triton's shim serves two megatron modules only);
# tests/ops/test_ops_shims.py checks this against the shims the plugins register
SHIMMED_PACKAGES: frozenset[str] = frozenset({
    "amp_C", "apex", "flash_attn", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda", "grouped_gemm",
    "transformer_engine"})

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


class TorchFirst(importlib.abc.MetaPathFinder):
    """Until torch is imported: a shimmed package no other finder found imports torch, then its shim.

    Sits at the end of ``sys.meta_path`` (an installed package is found first). ``import torch``
    runs the apply that ``import ascend_patch`` left pending, which installs the shims.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in SHIMMED_PACKAGES or "torch" in sys.modules:
            return None
        import torch  # noqa: F401  (the real package imports it too)

        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    @staticmethod
    def install() -> None:
        """Append the finder to ``sys.meta_path`` (once)."""
        if not any(isinstance(f, TorchFirst) for f in sys.meta_path):
            sys.meta_path.append(TorchFirst())

    @staticmethod
    def uninstall() -> None:
        """Take it out of ``sys.meta_path`` again."""
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchFirst)]
