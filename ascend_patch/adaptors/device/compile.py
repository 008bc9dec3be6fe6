"""``torch.compile`` of code moved to "cuda", compiled for the target's real device.

While patched, ``torch.cuda.is_available()`` is True, so Inductor took the host for a GPU:
``torch.utils._triton.has_triton()`` said yes whenever triton was installed (every CUDA build of
torch brings it), and Inductor asked triton's CUDA driver for its target, which fails on a host
without one (``InductorError: AssertionError: libcuda.so cannot found!``). What each target does:

* cpu: triton has no GPU to run on, so ``has_triton()`` is False and Inductor compiles the
  graphs (whose tensors are on the host) with its C++ backend; the modes that capture CUDA
  graphs (``reduce-overhead``, ``max-autotune``) run without them. Without a C++ compiler
  (Inductor's own search: ``CXX``, ``g++``) ``torch.compile`` falls back to TorchDynamo with
  ``backend="eager"``, with one warning.
* npu: Inductor where torch_npu has an Inductor backend for ``npu`` (torch_npu registers it when
  the first graph is compiled; the probe asks for it first); else the same eager fallback with
  one warning (torchair's ``get_npu_backend()`` is the graph mode to ask for).

Only the default backend (``"inductor"``) is changed; a backend the program names is its own.
The migration report says which was used.
"""

from __future__ import annotations

import warnings
from typing import Any

from ...backend import Backend
from ...patch import Action, Patch, Replace, Wrap
from ...usage import note

__all__ = ["compile_patches", "eager_reason"]

_TORCH = {"package": "torch", "versions": ">=2.13,<2.14"}  # Inductor's triton and compiler probes as measured
_reasons: dict[str, tuple[str, str] | None] = {}  # target -> why torch.compile runs eagerly there (None: it compiles)
_warned: set[str] = set()


def _no_cpp_compiler() -> tuple[str, str] | None:
    from torch._inductor import exc
    from torch._inductor.config import cpp

    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        searched = ", ".join(c for c in cpp.cxx if c) or "none"
        return ("no C++ compiler", f"Inductor's cpu backend needs a C++ compiler and found none (searched: {searched}; "
                "set CXX or install g++)")
    return None


def _no_inductor_backend(device_type: str) -> tuple[str, str] | None:
    import sys

    from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration

    init_backend_registration()
    failed = ""
    if get_scheduling_for_device(device_type) is None:
        # torch_npu registers its Inductor backend only when the first graph is compiled
        # (torch_npu.utils._dynamo.register_inductor_npu, which honours torch_npu's own switch to
        # disable it): ask for it now, so the probe sees what that graph would see.
        register = getattr(sys.modules.get("torch_npu.utils._dynamo"), "register_inductor_npu", None)
        if register is not None:
            try:
                register()
            except Exception as error:  # its Inductor backend failed to load: the graph would fail the same way
                failed = f" (registering it failed: {type(error).__name__}: {error})"
    if get_scheduling_for_device(device_type) is None:
        return (f"no Inductor backend for {device_type}",
                f"torch_npu registered no Inductor backend for {device_type!r} here{failed}; for graph mode on "
                "Ascend use torchair: torch.compile(model, backend=torchair.get_npu_backend())")
    return None


def eager_reason(target: Backend) -> tuple[str, str] | None:
    """(short label, full reason) why ``torch.compile``'s default backend cannot compile for ``target`` here.

    None: it can. Probed once per process and target (a compiler does not come and go while a program runs).
    """
    if target.name not in _reasons:
        _reasons[target.name] = (_no_cpp_compiler() if target.name == "cpu"
                                 else _no_inductor_backend(target.device_type))
    return _reasons[target.name]


_NO_CUDA_GRAPHS = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}


def _without_cuda_graphs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The cpu target's compile arguments: the modes that capture CUDA graphs, without them.

    CUDA graphs capture kernels of a GPU; on the host there are none to capture, and Inductor's
    check for them asks ``torch._C`` for the CUDA caching allocator, which a cpu build of torch
    does not have (AttributeError under the patched ``is_available()``).
    """
    mode, options = kwargs.get("mode"), kwargs.get("options")
    if mode in _NO_CUDA_GRAPHS:
        return {**kwargs, "mode": _NO_CUDA_GRAPHS[mode]}, f"; mode={mode!r} without CUDA graphs"
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        return {**kwargs, "options": {**options, "triton.cudagraphs": False}}, "; without CUDA graphs"
    return kwargs, ""


def _compile_for(target: Backend) -> Any:
    def compile(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kwargs.get("backend", "inductor") != "inductor" or kwargs.get("disable", False):
            return wrapped(*args, **kwargs)
        why = eager_reason(target)
        if why is None:
            if target.name != "cpu":
                note(f"torch.compile (Inductor, its {target.device_type} backend)", Action.TRANSLATED.value)
                return wrapped(*args, **kwargs)
            kwargs, dropped = _without_cuda_graphs(kwargs)
            note(f"torch.compile (Inductor, C++ on the host{dropped})", Action.TRANSLATED.value)
            return wrapped(*args, **kwargs)
        label, why = why
        note(f"torch.compile (eager: {label})", Action.EMULATED.value)
        dropped = [name for name in ("mode", "options") if kwargs.get(name) is not None]
        if target.name not in _warned:
            _warned.add(target.name)
            also = f"; its {' and '.join(dropped)} apply to Inductor only and are dropped" if dropped else ""
            warnings.warn(f"ascend_patch: torch.compile runs the model eagerly on the {target.name} target "
                          f"(TorchDynamo with backend='eager'): {why}{also}", stacklevel=2)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("mode", "options")}
        return wrapped(*args, **{**kwargs, "backend": "eager"})

    return compile


def _no_gpu_for_triton(original: Any) -> Any:
    def has_triton() -> bool:
        """False on the cpu target: "cuda" is the host there, and triton runs GPU kernels."""
        return False

    has_triton.__wrapped__ = original  # type: ignore[attr-defined]
    return has_triton


def compile_patches(target: Backend) -> list[Patch]:
    """torch.compile for the target's device; on cpu, Inductor does not take the host for a triton GPU."""
    return [
        Replace("torch.utils._triton:has_triton",
                "False: the emulated CUDA device is the host, so Inductor compiles C++ for it instead of asking "
                "triton's CUDA driver (libcuda.so cannot found)", make=_no_gpu_for_triton,
                backends=frozenset({"cpu"}), action=Action.EMULATED, count_calls=False, **_TORCH),
        Wrap("torch:compile",
             "the default backend compiles for the target's device (cpu: Inductor's C++; npu: torch_npu's Inductor "
             "backend), else runs eagerly (backend='eager') with one warning saying why",
             wrapper=_compile_for(target), action=Action.TRANSLATED, count_calls=False, rebind=False, **_TORCH),
    ]
