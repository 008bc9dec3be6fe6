"""A ``triton`` shim for the megatron-core modules that cannot be imported without triton.

Every supported release has modules that run ``import triton`` at module level on an import chain with no
fallback: 0.16's ``batch_invariant_kernels`` (imported by Megatron-LM's ``initialize``), main's MoE
``paged_stash`` ops (imported by ``megatron.core`` itself) and Mamba ``ssm/ops`` (imported by
``megatron.training``), ... An Ascend host has no CUDA triton, so without it Megatron-LM cannot start. The
kernels those modules define run only when a flag asks for them, and the npu and cpu targets have nothing to
run them with.

Which importers are served is a rule, not a list (:func:`served_importer`): a megatron module gets the shim
unless the import is inside ``try: ... except ImportError`` (or a handler catching it) in one of the megatron
frames of the import chain — that module, or whichever megatron module is importing it — since such code
has its own fallback for a missing triton and keeps it. Everyone else that imports triton (torch's Inductor,
transformers, ...) gets ``ModuleNotFoundError`` as without the shim; libraries that probe with
``importlib.util.find_spec`` are listed in :data:`HIDDEN_FROM`, so the finder gives them no spec either.
The shim is served only while the real ``triton`` is missing (an installed triton, or triton-ascend, is
always found first), is marked as a shim, and goes away on ``remove()``. Once a module has its ``triton``
(its first ``@triton.jit``), the shim leaves ``sys.modules`` again, so a later ``import triton`` elsewhere is
not answered from the cache.

``@triton.jit`` (bare or with options), ``triton.autotune``/``heuristics``/``Config``, ``triton.cdiv``/
``next_power_of_2``, ``triton.__version__`` and ``triton.language.constexpr``/``int32``/``int64`` exist so
that those modules import; *launching* a kernel raises :class:`TritonUnavailable`, naming the kernel and the
flag that asked for it.
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
from collections.abc import Callable
from typing import Any

from ...errors import AscendPatchError
from ...shim import ShimBuilder, ShimModule, ShimSpec, ShimTable, is_shim
from .releases import TRITON_KERNEL_USERS

__all__ = ["HIDDEN_FROM", "TRITON", "TRITON_NAMES", "TRITON_VERSION", "TritonShims", "TritonUnavailable",
           "build_triton_shim", "flag_for", "guarded_lines", "served_importer"]

# libraries that probe with importlib.util.find_spec("triton") before importing it
HIDDEN_FROM: tuple[str, ...] = ("torch", "transformers", "accelerate", "torchao", "xformers", "bitsandbytes",
                                "liger_kernel", "kernels", "deepspeed", "vllm", "peft")

# triton.__version__: main's Mamba ops parse it (>= 3.0 takes their triton-3 branches; nothing runs)
TRITON_VERSION = "3.4.0"

_MACHINERY = ("importlib", "_frozen_importlib", "wrapt", "ascend_patch", "triton")
_CATCHING = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


class TritonUnavailable(AscendPatchError, RuntimeError):
    """A triton kernel was launched where triton is not installed."""


def flag_for(module: str) -> str:
    """What asks for the kernels of ``module`` (the flag to turn off), or a generic phrase."""
    for prefix, flag in TRITON_KERNEL_USERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return flag
    return "the option that selected this triton kernel"


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:  # a bare except
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else "") in _CATCHING
               for t in types)


@functools.lru_cache(maxsize=512)
def guarded_lines(filename: str) -> frozenset[int]:
    """The lines of ``filename`` inside the body of a ``try`` with a handler that catches ImportError."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))) and any(
                _catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return frozenset(lines)


def _megatron(module: str) -> bool:
    return module == "megatron" or module.startswith("megatron.")


def served_importer(frame: Any = None) -> str | None:
    """The megatron module importing triton now, when it gets the shim; None when it does not.

    It does not when the importing code (the first frame outside the import machinery) is not megatron's, or
    when any megatron frame of the chain runs that import inside a ``try`` that catches ImportError: that
    code falls back by itself, as it does where triton is not installed.
    """
    frame = frame if frame is not None else sys._getframe(1)
    importer = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if importer is None and not module.startswith(_MACHINERY):
            importer = module
            if not _megatron(module):
                return None
        if importer is not None and _megatron(module) and frame.f_lineno in guarded_lines(frame.f_code.co_filename):
            return None
        frame = frame.f_back
    return importer


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


class dtype:  # noqa: N801 (triton's name)
    """``triton.language``'s integer types: annotations of kernel arguments, never computed with here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"triton.language.{self.name}"


int32 = dtype("int32")
int64 = dtype("int64")

_HINT = ("triton is not installed; ascend_patch's shim provides only what lets megatron-core's modules that import "
         "triton without a fallback be imported (jit, autotune, heuristics, Config, cdiv, next_power_of_2, "
         "__version__, language.constexpr/int32/int64). Install triton (or triton-ascend) to run triton kernels")
_HERE = "ascend_patch.adaptors.megatron.triton_shim"

TRITON: ShimTable = {
    "triton": ShimSpec("kernels import but refuse to launch", {
        "jit": f"{_HERE}:jit", "autotune": f"{_HERE}:passthrough", "heuristics": f"{_HERE}:passthrough",
        "Config": f"{_HERE}:Config", "cdiv": f"{_HERE}:cdiv", "next_power_of_2": f"{_HERE}:next_power_of_2"},
        hints={"*": _HINT}, version=TRITON_VERSION),
    "triton.language": ShimSpec("constexpr and the integer types kernels annotate with", {
        "constexpr": f"{_HERE}:constexpr", "int32": f"{_HERE}:int32", "int64": f"{_HERE}:int64"},
        hints={"*": _HINT}),
}
TRITON_NAMES: tuple[str, ...] = tuple(TRITON)


class TritonShims(ShimBuilder):
    """The :data:`TRITON` modules, for the importers :func:`served_importer` names: any other importer gets
    ``ModuleNotFoundError``, as if the shim did not exist."""

    def __call__(self, name: str) -> ShimModule:
        self.spec(name)
        if served_importer(sys._getframe(1)) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return super().__call__(name)


# the make of the triton ModuleShim patches (its objects are this module's; nothing is per apply)
build_triton_shim = TritonShims(TRITON)
