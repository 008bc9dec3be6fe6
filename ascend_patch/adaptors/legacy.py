"""Legacy CUDA tensor types and the ``with torch.device("cuda"):`` context, onto the target.

* ``torch.cuda.FloatTensor(2)``, ``torch.cuda.LongTensor([1])``, ... build the tensor on
  the target (the current device on npu), with the legacy constructor's semantics
  (a size makes an uninitialised tensor, a sequence copies the data);
  ``isinstance(t, torch.cuda.FloatTensor)`` is True for float32 tensors on the target,
  and ``t.type(torch.cuda.HalfTensor)`` converts. The list of types is read from
  ``torch.cuda`` itself.
* ``with torch.device("cuda:1"):`` (and everything else that enters torch's
  ``DeviceContext``, such as ``torch.set_default_device``) places factory calls on the
  target instead of failing on the CUDA backend.
"""

from __future__ import annotations

from typing import Any

import torch

from ..backend import Backend
from ..devices import DeviceMap
from ..patch import Patch, Replace, replacing
from ..usage import note

__all__ = ["legacy_patches", "legacy_type_names"]


def legacy_type_names() -> list[str]:
    """The ``torch.cuda.<X>Tensor`` legacy types that have a host counterpart ``torch.<X>Tensor``."""
    names = []
    for name in dir(torch.cuda):
        obj = getattr(torch.cuda, name, None)
        ours = getattr(obj, "__ascend_legacy__", False)  # while patched: our stand-in
        if name.endswith("Tensor") and (ours or type(obj).__name__ == "tensortype") and hasattr(torch, name):
            names.append(name)
    return sorted(names)


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
    return patches
