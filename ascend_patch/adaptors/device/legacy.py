"""Legacy CUDA tensor types and the ``with torch.device("cuda"):`` context, onto the target.

* ``torch.cuda.FloatTensor(2)``, ``torch.cuda.LongTensor([1])``, ... build the tensor on
  the target (the current device on npu), with the legacy constructor's semantics
  (a size makes an uninitialised tensor, a sequence copies the data);
  ``isinstance(t, torch.cuda.FloatTensor)`` is True for float32 tensors on the target,
  and ``t.type(torch.cuda.HalfTensor)`` converts. The list of types is read from
  ``torch.cuda`` itself.
* ``torch.cuda.FloatStorage(3)``, ... (the legacy storage types) build a typed storage on
  the target; ``isinstance(s, torch.cuda.FloatStorage)`` holds for such storages.
* ``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` (a name or the type) sets the
  target's type: ``torch.FloatTensor`` on cpu, ``torch.npu.FloatTensor`` on npu (torch_npu's
  legacy types); the default dtype follows, as it does on CUDA.
* ``with torch.device("cuda:1"):`` (and everything else that enters torch's
  ``DeviceContext``, such as ``torch.set_default_device``) places factory calls on the
  target instead of failing on the CUDA backend.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ...backend import Backend
from ...devices import DeviceMap
from ...patch import Action, Patch, Replace, Wrap, replacing
from ...usage import note

__all__ = ["legacy_patches", "legacy_storage_names", "legacy_type_names"]


def legacy_type_names() -> list[str]:
    """The ``torch.cuda.<X>Tensor`` legacy types that have a host counterpart ``torch.<X>Tensor``."""
    names = []
    for name in dir(torch.cuda):
        obj = getattr(torch.cuda, name, None)
        ours = getattr(obj, "__ascend_legacy__", False)  # while patched: our stand-in
        if name.endswith("Tensor") and (ours or type(obj).__name__ == "tensortype") and hasattr(torch, name):
            names.append(name)
    return sorted(names)


def _storage_dtype(obj: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading a legacy storage class's dtype warns that TypedStorage is deprecated
        return getattr(obj, "dtype", None)


def legacy_storage_names() -> list[str]:
    """The ``torch.cuda.<X>Storage`` legacy types that have a host counterpart ``torch.<X>Storage``."""
    names = []
    for name in dir(torch.cuda):
        if not name.endswith("Storage") or not hasattr(torch, name):
            continue
        obj = getattr(torch.cuda, name, None)
        if isinstance(obj, type) and isinstance(_storage_dtype(obj), torch.dtype):
            names.append(name)
    return sorted(names)


def _legacy_storage(name: str, dtype: torch.dtype, target: Backend) -> type:
    host_type = getattr(torch, name)
    api = f"torch.cuda.{name}"

    class _LegacyStorage(type):
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            note(api)
            storage = host_type(*args, **kwargs)  # warns as torch's legacy storages do
            if target.keeps_index:  # npu: the current device, as CUDA's legacy storages use
                storage = storage.to(device=target.device(target.device_module.current_device()))
            return storage

        def __instancecheck__(cls, obj: Any) -> bool:
            return (isinstance(obj, torch.TypedStorage) and obj.dtype == dtype
                    and obj.device.type == target.device_type)

        def __subclasscheck__(cls, sub: type) -> bool:
            return sub is cls

    return _LegacyStorage(name, (), {
        "__module__": "torch.cuda", "__qualname__": name, "dtype": dtype, "is_cuda": True,
        "__ascend_legacy__": True, "__doc__": f"{api} on the {target.name} target: builds {dtype} storages there."})


def _default_tensor_type(target: Backend) -> Any:
    prefix = "torch." if target.name == "cpu" else f"torch.{target.device_type}."

    def set_default_tensor_type(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t = args[0] if args else kwargs.get("t")
        name = t if isinstance(t, str) else None
        if getattr(t, "__ascend_legacy__", False):
            name = f"torch.cuda.{t.__name__}"
        if name is not None and name.startswith("torch.cuda.") and name.endswith("Tensor"):
            note("torch.set_default_tensor_type(torch.cuda.*Tensor)")
            return wrapped(prefix + name[len("torch.cuda."):])
        return wrapped(*args, **kwargs)

    return set_default_tensor_type


def _legacy_type(name: str, dtype: torch.dtype, target: Backend, dmap: DeviceMap) -> type:
    host_type = getattr(torch, name)
    api = f"torch.cuda.{name}"

    def destination(device: Any) -> Any:
        if device is not None:
            return dmap(device)
        index = target.device_module.current_device() if target.keeps_index else None
        return target.device(index)

    class _LegacyType(type):
        def __call__(cls, *args: Any, device: Any = None) -> torch.Tensor:
            note(api)
            tensor = host_type(*args)
            where = destination(device)
            return tensor if tensor.device == where else tensor.to(where)

        def __instancecheck__(cls, obj: Any) -> bool:
            return (isinstance(obj, torch.Tensor) and obj.dtype == dtype and obj.layout == torch.strided
                    and obj.device.type == target.device_type)

        def __subclasscheck__(cls, sub: type) -> bool:
            return sub is cls

    return _LegacyType(name, (), {
        "__module__": "torch.cuda", "__qualname__": name, "dtype": dtype, "layout": torch.strided,
        "is_cuda": True, "is_sparse": False, "__ascend_legacy__": True,
        "__doc__": f"{api} on the {target.name} target: builds {dtype} tensors there."})


def _device_context_init(original: Any, dmap: DeviceMap) -> Any:
    @replacing(original)
    def __init__(self: Any, device: Any) -> None:
        mapped = dmap(device)
        if mapped is not device:
            note('with torch.device("cuda")')
        original(self, mapped)

    return __init__


def legacy_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    """The legacy ``torch.cuda.*Tensor`` types and torch's DeviceContext, for ``target``."""
    patches = [Replace("torch.utils._device:DeviceContext.__init__",
                       "with torch.device('cuda') / set_default_device place factories on the target",
                       make=lambda orig: _device_context_init(orig, dmap),
                       api='with torch.device("cuda")', count_calls=False)]
    for name in legacy_type_names():
        dtype = getattr(torch.cuda, name).dtype
        patches.append(Replace(f"torch.cuda:{name}",
                               "the legacy constructor builds on the target; isinstance holds for target tensors",
                               replacement=_legacy_type(name, dtype, target, dmap), count_calls=False))
    for name in legacy_storage_names():
        dtype = _storage_dtype(getattr(torch.cuda, name))
        patches.append(Replace(f"torch.cuda:{name}",
                               "the legacy storage builds on the target; isinstance holds for target storages",
                               replacement=_legacy_storage(name, dtype, target), count_calls=False))
    patches.append(Wrap("torch:set_default_tensor_type",
                        "torch.cuda.*Tensor (name or type) becomes the target's legacy type",
                        wrapper=_default_tensor_type(target), action=Action.TRANSLATED, count_calls=False))
    return patches
