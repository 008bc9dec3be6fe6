"""A ``triton`` shim for the megatron-core modules that cannot be imported without triton.

Megatron-LM's ``megatron/training/initialize.py`` imports
``megatron.core.transformer.custom_layers.batch_invariant_kernels``, which runs ``import triton``
at module level with no fallback (so does megatron-core's Mamba inference module
``attention_context/triton/tensor_ops.py``, imported by ``mamba_mixer``). An Ascend host has no
CUDA triton, so without triton Megatron-LM cannot even start. The kernels those modules define
run only when a flag asks for them (``--batch-invariant-mode``, Mamba inference), and the npu and
cpu targets have nothing to run them with.

The shim is served only while the real ``triton`` is missing (an installed triton, or
triton-ascend, is always found first), is marked as a shim, and goes away on ``remove()``. It is
served **only to those modules** (:data:`IMPORTERS`): everyone else that imports triton —
megatron-core's optional fusions and inference kernels behind ``try: ... except ImportError``,
torch's Inductor, transformers — still gets ``ModuleNotFoundError`` and keeps its own fallback,
exactly as without the shim. (Libraries that probe with ``importlib.util.find_spec`` are listed in
:data:`HIDDEN_FROM`, so the finder gives them no spec either.) Once such a module has its
``triton`` (its first ``@triton.jit``), the shim leaves ``sys.modules`` again, so a later
``import triton`` elsewhere is not answered from the cache.

``@triton.jit`` (bare or with options), ``triton.autotune``/``heuristics``/``Config``,
``triton.cdiv``/``next_power_of_2`` and ``triton.language.constexpr`` exist so that those modules
import; *launching* a kernel raises :class:`TritonUnavailable`, naming the kernel and the flag
that asked for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ...errors import AscendPatchError
from ...shim import ShimBuilder, ShimModule, ShimSpec, ShimTable, is_shim
from .releases import TRITON_IMPORTERS

__all__ = ["HIDDEN_FROM", "IMPORTERS", "TRITON", "TRITON_NAMES", "TritonShims", "TritonUnavailable",
           "build_triton_shim", "flag_for"]

# megatron-core modules that import triton at module level with no fallback (see .releases)
IMPORTERS: tuple[str, ...] = tuple(TRITON_IMPORTERS)

# libraries that probe with importlib.util.find_spec("triton") before importing it
HIDDEN_FROM: tuple[str, ...] = ("torch", "transformers", "accelerate", "torchao", "xformers", "bitsandbytes",
                                "liger_kernel", "kernels", "deepspeed", "vllm", "peft")

_MACHINERY = ("importlib", "_frozen_importlib", "wrapt", "ascend_patch", "triton")


class TritonUnavailable(AscendPatchError, RuntimeError):
    """A triton kernel was launched where triton is not installed."""


def flag_for(module: str) -> str:
    """What asks for the kernels of ``module`` (the flag to turn off), or a generic phrase."""
    return TRITON_IMPORTERS.get(module, "the option that selected this triton kernel")


def _importer() -> str:
    """``__name__`` of the module whose code runs the current import (import machinery skipped)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_MACHINERY):
            return name
        frame = frame.f_back
    return ""


def _uncache() -> None:
    """Drop the shim from sys.modules: the importer holds it; nobody else should find it cached."""
    for name in reversed(TRITON_NAMES):
        if is_shim(sys.modules.get(name)):
            del sys.modules[name]


class _Kernel:
    """What ``@triton.jit`` returns here: the function, kept for introspection, that refuses to launch."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = options
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", "")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        where = f"{self.__module__}.{self.__qualname__}"
        raise TritonUnavailable(
            f"triton kernel {where} was launched, but triton is not installed here: ascend_patch's triton "
            f"shim only lets {self.__module__} be imported. It is used by {flag_for(self.__module__)}; "
            "turn that off on the npu/cpu target (there is no triton backend to run it).")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._refuse

    __call__ = _refuse

    def __repr__(self) -> str:
        return f"<triton shim kernel {self.__module__}.{self.__qualname__} (cannot launch)>"


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@triton.jit`` and ``@triton.jit(...)``: a kernel that raises when launched."""
    _uncache()  # the importing module is past its imports: it has its triton
    if fn is None:
        return lambda f: _Kernel(f, options)
    return _Kernel(fn, options)


def passthrough(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """``@triton.autotune(...)`` / ``@triton.heuristics(...)``: the kernel unchanged."""
    return lambda kernel: kernel


class Config:
    """``triton.Config``: holds the options (read by nothing on these targets)."""

    def __init__(self, kwargs: dict[str, Any], num_warps: int = 4, num_stages: int = 2, **options: Any) -> None:
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.options = options


def cdiv(x: int, y: int) -> int:
    """Ceiling division, as ``triton.cdiv``."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class constexpr:  # noqa: N801 (triton's name)
    """``triton.language.constexpr``: the annotation of compile-time kernel arguments."""

    def __init__(self, value: Any = None) -> None:
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self) -> str:
        return f"constexpr[{self.value!r}]"


_HINT = ("triton is not installed; ascend_patch's shim provides only what lets megatron-core's "
         "batch-invariant and Mamba inference kernels be imported (jit, autotune, heuristics, Config, cdiv, "
         "next_power_of_2, language.constexpr). Install triton (or triton-ascend) to run triton kernels")
_HERE = "ascend_patch.adaptors.megatron.triton_shim"

TRITON: ShimTable = {
    "triton": ShimSpec("kernels import but refuse to launch", {
        "jit": f"{_HERE}:jit", "autotune": f"{_HERE}:passthrough", "heuristics": f"{_HERE}:passthrough",
        "Config": f"{_HERE}:Config", "cdiv": f"{_HERE}:cdiv", "next_power_of_2": f"{_HERE}:next_power_of_2"},
        hints={"*": _HINT}),
    "triton.language": ShimSpec("constexpr only", {"constexpr": f"{_HERE}:constexpr"}, hints={"*": _HINT}),
}
TRITON_NAMES: tuple[str, ...] = tuple(TRITON)


class TritonShims(ShimBuilder):
    """The :data:`TRITON` modules, for :data:`IMPORTERS` only: any other importer gets ``ModuleNotFoundError``,
    as if the shim did not exist."""

    def __call__(self, name: str) -> ShimModule:
        self.spec(name)
        if _importer() not in IMPORTERS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return super().__call__(name)


# the make of the triton ModuleShim patches (its objects are this module's; nothing is per apply)
build_triton_shim = TritonShims(TRITON)
