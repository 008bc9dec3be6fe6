"""Every torch function that takes ``device=``, found from torch itself, wrapped to translate it.

The list is derived at apply time, so a new torch release is covered without edits:
each public ``torch.<name>`` whose ATen schema has a ``device`` argument, the
``torch.fft`` ones, every ``Tensor.new_*`` method, and whatever torch's own
device-constructor table (the one ``with torch.device(...)`` uses) names.

Wrappers are plain closures with one dict lookup when ``device=`` is given and none
otherwise; functions without a device argument are never touched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ...patch import Action, Patch, Replace
from ...usage import active_recorder
from ...devices import NOT_A_DEVICE, DeviceMap

__all__ = ["derive_device_functions", "factory_patches", "device_kwarg_wrapper"]

# Handled by dedicated adaptors (tensors.py) because their device argument is positional
# or their semantics need more than a translation.
_SPECIAL = {"to", "pin_memory", "is_pinned"}


# Python-level factories taking pin_memory= that their TorchScript schema does not list.
_PYTHON_PIN = {"tensor"}


def _has_device_arg(op: str, name: str = "device") -> bool:
    try:
        schemas = torch._C._jit_get_schemas_for_operator(op)
    except RuntimeError:
        return False
    return any(arg.name == name for schema in schemas for arg in schema.arguments)


def _public_name(fn: Any) -> tuple[str, str] | None:
    name = getattr(fn, "__name__", None)
    if not name:
        return None
    for module_name in ("torch", getattr(fn, "__module__", None) or ""):
        module = __import__("sys").modules.get(module_name)
        if module is not None and getattr(module, name, None) is fn:
            return module_name, name
    return None


def derive_device_functions() -> list[tuple[str, str]]:
    """(module, attribute) of every public torch callable that takes a ``device`` argument."""
    found: set[tuple[str, str]] = set()
    vf = torch._C._VariableFunctions
    for name in dir(vf):
        if name.startswith("_") or name in _SPECIAL or not hasattr(torch, name):
            continue
        if _has_device_arg(f"aten::{name}"):
            found.add(("torch", name))
    for name in dir(torch._C._fft):
        if name.startswith("fft_") and _has_device_arg(f"aten::{name}") and hasattr(torch.fft, name[4:]):
            found.add(("torch.fft", name[4:]))
    for name in dir(torch.Tensor):
        if name.startswith("new_"):
            found.add(("torch", f"Tensor.{name}"))
    import torch.utils._device as torch_device

    for fn in torch_device._device_constructors():
        public = _public_name(fn)
        if public is not None and not public[0].startswith("torch._C"):
            found.add(public)
    return sorted(found)


def _made_pinned(original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    from .tensors import _PINNED

    del kwargs["pin_memory"]
    out = original(*args, **kwargs)
    setattr(out, _PINNED, True)
    return out


def device_kwarg_wrapper(original: Callable[..., Any], dmap: DeviceMap, api: str,
                         pin_on_host: bool = False) -> Callable[..., Any]:
    """``original`` with its ``device=`` keyword translated (recording uses when reporting).

    ``pin_on_host``: the cpu target has no pinned allocator behind ``pin_memory=True`` (torch
    raises), so the tensor is made in ordinary host memory and marked pinned, as
    ``Tensor.pin_memory()`` marks it. Both jobs are done by one closure: a second layer
    would double the cost of every factory call.
    """
    lookup = dmap.lookup
    cached = dmap.cache.get
    missing = object()
    recorder = active_recorder()
    if recorder is None:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not kwargs:
                return original(*args)
            device = kwargs.get("device")
            if device is not None:
                try:
                    mapped = cached(device, missing)
                except TypeError:
                    mapped = NOT_A_DEVICE
                if mapped is missing:
                    mapped = lookup(device)
                if mapped is not NOT_A_DEVICE:
                    kwargs["device"] = mapped
            if pin_on_host and kwargs.get("pin_memory"):
                return _made_pinned(original, args, kwargs)
            return original(*args, **kwargs)
    else:
        shown = f"{api}(device=cuda)"

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is not None:
                mapped = lookup(device)
                if mapped is not NOT_A_DEVICE:
                    kwargs["device"] = mapped
                    recorder.hit(shown, Action.TRANSLATED.value)
            if pin_on_host and kwargs.get("pin_memory"):
                return _made_pinned(original, args, kwargs)
            return original(*args, **kwargs)

    # name, docstring and __wrapped__ (inspect.signature sees the original)
    functools.update_wrapper(wrapper, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return wrapper


def _register_jit_builtin(original: Any, wrapper: Any) -> None:
    """Let TorchScript keep treating the wrapped name as the ATen builtin it was."""
    try:
        from torch.jit import _builtins

        table = _builtins._get_builtin_table()
        op = table.get(id(original))
        if op is not None:
            _builtins._register_builtin(wrapper, op)
    except Exception:
        pass


def factory_patches(dmap: DeviceMap) -> list[Patch]:
    """One REPLACE patch per device-taking torch function."""
    import torch.utils._device as torch_device

    # torch caches its set of device constructors on first use; filled after wrapping it
    # would hold our wrappers, and `with torch.device("meta")` would stop recognising the
    # originals it is handed, silently building meta models in real memory.
    torch_device._device_constructors()

    def make(api: str, pinning: bool) -> Callable[[Any], Any]:
        def build(original: Any) -> Any:
            wrapper = device_kwarg_wrapper(original, dmap, api, pin_on_host=pinning)
            _register_jit_builtin(original, wrapper)
            return wrapper

        return build

    on_host = dmap.backend.name == "cpu"
    patches = []
    for module, attr in derive_device_functions():
        api = f"{module}.{attr}"
        op = attr.rsplit(".", 1)[-1]  # Tensor.new_empty -> new_empty
        pinning = on_host and module == "torch" and (op in _PYTHON_PIN or _has_device_arg(f"aten::{op}", "pin_memory"))
        patches.append(Replace(
            target=f"{module}:{attr}", make=make(api, pinning),
            reason="translate device='cuda'/'cuda:N'/torch.device('cuda') onto the target",
            api=api, count_calls=False))
    return patches
