"""Tensor, Module and storage methods that move data or name CUDA types.

Semantics kept from CUDA, not just names:

* a transfer to or from the device is a **copy** on the cpu target too
  (``.cuda()``, ``.to("cuda")``, ``.cpu()``, ``.to("cpu")``), never an alias of the host
  tensor: code that refills a staging buffer or snapshots weights depends on it. On npu
  the device is real, so CUDA's own rule holds: ``.cuda()`` / ``.to("cuda")`` of a tensor
  already on that device returns the tensor itself;
* ``Tensor.is_cuda`` is True for target tensors, and ``Tensor.type()`` reports and
  accepts the ``torch.cuda.*Tensor`` names Megatron-style code compares against;
* ``pin_memory()`` returns a (pinned-marked) copy and ``is_pinned()`` answers for it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ...backend import Backend
from ...patch import Action, Patch, Replace, replacing
from ...usage import UsageRecorder, active_recorder, note
from ...devices import NOT_A_DEVICE, DeviceMap

__all__ = ["tensor_patches"]

_PINNED = "_ascend_patch_pinned"


def _hit(recorder: UsageRecorder | None, api: str, action: str = "translated") -> None:
    if recorder is not None:
        recorder.hit(api, action)


def _is_host(device: Any) -> bool:
    kind = type(device)
    return (kind is str and device == "cpu") or (kind is torch.device and device.type == "cpu")


def _to_wrapper(original: Any, dmap: DeviceMap, copy_host: bool, api: str) -> Any:
    """Tensor.to: translate a device given positionally or by keyword.

    ``copy_host`` (the cpu target): a transfer to or from "the device" is a copy even
    though both ends are the host.
    """
    lookup = dmap.lookup
    recorder = active_recorder()

    @replacing(original)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        moved = False
        if args:
            mapped = lookup(args[0])
            if mapped is not NOT_A_DEVICE:
                args = (mapped, *args[1:])
                moved = True
                _hit(recorder, api)
            elif copy_host and _is_host(args[0]):
                moved = True
        if "device" in kwargs:
            device = kwargs["device"]
            mapped = lookup(device)
            if mapped is not NOT_A_DEVICE:
                kwargs["device"] = mapped
                moved = True
                _hit(recorder, api)
            elif copy_host and _is_host(device):
                moved = True
        out = original(self, *args, **kwargs)
        if moved and copy_host and out is self:
            out = self.clone()
        return out

    return to


def _cuda_wrapper(target: Backend, dmap: DeviceMap, api: str, module: bool) -> Any:
    recorder = active_recorder()
    copy = target.name == "cpu"  # host -> "device" must not alias; on npu CUDA's no-op rule holds

    def device_for(device: Any) -> Any:
        if device is None:
            return target.device(target.device_module.current_device() if target.keeps_index else None)
        return dmap(device)

    if module:
        def cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
            _hit(recorder, api)
            return self.to(device_for(device))
    else:
        def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
                 memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
            _hit(recorder, api)
            return torch.Tensor.to(self, device_for(device), non_blocking=non_blocking,
                                   memory_format=memory_format, copy=copy)
    return cuda


def _cpu_copy(original: Any) -> Any:
    @replacing(original)
    def cpu(self: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        out = original(self, memory_format=memory_format)
        return out.clone() if out is self else out

    return cpu


def _module_to(original: Any, dmap: DeviceMap, api: str) -> Any:
    lookup = dmap.lookup

    @replacing(original)
    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if args:
            mapped = lookup(args[0])
            if mapped is not NOT_A_DEVICE:
                args = (mapped, *args[1:])
                note(api)
        if "device" in kwargs:
            mapped = lookup(kwargs["device"])
            if mapped is not NOT_A_DEVICE:
                kwargs["device"] = mapped
                note(api)
        return original(self, *args, **kwargs)

    return to


def _type_wrapper(original: Any, target: Backend) -> Any:
    """Tensor.type(): target tensors report torch.cuda.* names and accept them."""
    dev = target.device_type
    prefix = "torch." if dev == "cpu" else f"torch.{dev}."
    recorder = active_recorder()

    @replacing(original)
    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None:
            name = original(self)
            if self.device.type == dev:
                _hit(recorder, "torch.Tensor.type() -> torch.cuda.*")
                return "torch.cuda." + name[len(prefix):]
            return name
        if isinstance(dtype, type) and dtype.__module__ == "torch.cuda":
            dtype = f"torch.cuda.{dtype.__name__}"  # the legacy torch.cuda.FloatTensor classes
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            _hit(recorder, "torch.Tensor.type('torch.cuda.*')")
            dtype = prefix + dtype[len("torch.cuda."):]
        return original(self, dtype, non_blocking, **kwargs)

    return type_


def _is_on_target(device_type: str) -> property:
    """``Tensor.is_cuda`` for target tensors: torch's own ``is_<type>`` property where it has one.

    ``is_cpu`` lives on ``torch._C.TensorBase``; a renamed privateuse1 backend gets its
    ``is_npu`` on ``torch.Tensor`` (``generate_methods_for_privateuse1_backend``), and
    torch_npu may put it on either. Without one, the device type is compared.
    """
    for owner in (torch._C.TensorBase, torch.Tensor):
        found = inspect.getattr_static(owner, f"is_{device_type}", None)
        getter = getattr(found, "__get__", None)
        if getter is not None and not callable(found):  # a property or getset descriptor
            return property(getter)

    def is_target(self: torch.Tensor) -> bool:
        return self.device.type == device_type

    return property(is_target)


def _pin_memory(original: Any) -> Any:
    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        out = self.clone()
        setattr(out, _PINNED, True)
        return out

    return pin_memory


def _is_pinned(original: Any) -> Any:
    def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
        return bool(getattr(self, _PINNED, False))

    return is_pinned


def _storage_to(original: Any, dmap: DeviceMap) -> Any:
    lookup = dmap.lookup

    @replacing(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            mapped = lookup(kwargs["device"])
            if mapped is not NOT_A_DEVICE:
                kwargs["device"] = mapped
        return original(self, *args, **kwargs)

    return to


def tensor_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    """The Tensor / Module / storage method patches for ``target``."""
    on_cpu = target.name == "cpu"
    r = "transfers onto the target, and copies as CUDA transfers do"
    patches = [
        Replace("torch:Tensor.to", r,
                make=lambda orig: _to_wrapper(orig, dmap, on_cpu, "torch.Tensor.to(cuda)"), count_calls=False),
        Replace("torch:Tensor.cuda", r,
                replacement=_cuda_wrapper(target, dmap, "torch.Tensor.cuda", module=False), count_calls=False),
        Replace("torch.nn:Module.to", "module moves onto the target",
                make=lambda orig: _module_to(orig, dmap, "torch.nn.Module.to(cuda)"), count_calls=False),
        Replace("torch.nn:Module.to_empty", "module materialisation onto the target",
                make=lambda orig: _module_to(orig, dmap, "torch.nn.Module.to_empty(device=cuda)"), count_calls=False),
        Replace("torch.nn:Module.cuda", "module moves onto the target",
                replacement=_cuda_wrapper(target, dmap, "torch.nn.Module.cuda", module=True), count_calls=False),
        Replace("torch:Tensor.type", "CUDA tensor type names for target tensors",
                make=lambda orig: _type_wrapper(orig, target), count_calls=False),
        Replace("torch:Tensor.is_cuda", "target tensors are CUDA tensors to the program",
                replacement=_is_on_target(target.device_type), api="torch.Tensor.is_cuda"),
        Replace("torch.storage:_StorageBase.to", "storage moves onto the target",
                make=lambda orig: _storage_to(orig, dmap), count_calls=False),
        Replace("torch.storage:TypedStorage.to", "storage moves onto the target",
                make=lambda orig: _storage_to(orig, dmap), count_calls=False),
    ]
    if on_cpu:
        patches += [
            Replace("torch:Tensor.cpu", "a device-to-host transfer is a copy",
                    make=_cpu_copy, count_calls=False, backends=frozenset({"cpu"})),
            Replace("torch:Tensor.pin_memory",
                    "the host has no pinned memory: a copy marked as pinned", make=_pin_memory,
                    action=Action.EMULATED, backends=frozenset({"cpu"})),
            Replace("torch:Tensor.is_pinned", "answers for pin_memory() copies",
                    make=_is_pinned, action=Action.EMULATED, backends=frozenset({"cpu"})),
            Replace("torch:Tensor.record_stream",
                    "one execution queue on the host: nothing to record",
                    replacement=lambda self, stream: None, action=Action.NOOP, backends=frozenset({"cpu"})),
        ]
    return patches
