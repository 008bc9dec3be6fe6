"""``torch.accelerator`` gives the same answers as the patched ``torch.cuda``.

PyTorch 2.6+ code asks ``torch.accelerator`` which device to use
(``current_accelerator()``, ``device_count()``, ``set_device_index(rank)``) instead of
``torch.cuda``. One device model serves both:

* **cpu target.** The host build of torch has no accelerator, so ``torch.accelerator``
  would say "none" while ``torch.cuda.is_available()`` says True and scripts would
  silently take their CPU path. While patched the cpu target is the accelerator a CUDA
  build reports: ``current_accelerator()`` is ``device(type='cuda')`` (the translation
  model: the program believes it is on CUDA, its tensors land on the host),
  ``is_available()`` is ``torch.cuda.is_available()`` (``ASCEND_PATCH_CUDA_IS_AVAILABLE``),
  and the count, the current index, streams, synchronisation and memory statistics are
  the cpu device module's, the very functions ``torch.cuda.*`` runs. A ``"cuda:N"``
  given to ``torch.get_device_module``, ``.to()``, autocast or
  ``dist.get_default_backend_for_device`` is then translated as everywhere else.
* **npu target.** torch_npu registers its own accelerator (privateuse1, ``"npu"``):
  ``current_accelerator()`` stays ``device(type='npu')`` and its streams, memory
  statistics and count are torch_npu's, the same ``torch.npu`` that ``torch.cuda.*``
  calls reach. Selecting and synchronising a device (``set_device_index``,
  ``current_device_index``, ``device_index``, ``synchronize``) go through ``torch.npu``
  too, so the two namespaces cannot disagree on the current device; a CUDA device given
  to ``torch.accelerator`` (``set_device_index("cuda:1")``) names the NPU with the same
  index instead of being refused as "not the current accelerator"; ``is_available()``
  honours ``ASCEND_PATCH_CUDA_IS_AVAILABLE`` as ``torch.cuda.is_available()`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from ...backend import Backend
from ...config import Settings
from ...devices import NOT_A_DEVICE, DeviceMap
from ...patch import Action, Patch, Replace, Wrap

__all__ = ["Accelerator", "NPU_THROUGH_DEVICE_MODULE", "accelerator_patches"]

_MOD = "torch.accelerator"
# dtypes tensors can be made in and converted between on the host
_HOST_DTYPES = frozenset({
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2,
})


class Accelerator:
    """``torch.accelerator``'s functions, answered by the target's device module."""

    def __init__(self, target: Backend, settings: Settings) -> None:
        self.dm = target.device_module
        self.available = settings.cuda_is_available
        self.cuda = torch.device("cuda")
        # the device types torch.accelerator accepts: cuda, and the target's own (where the tensors
        # are: `current_stream(tensor.device)`, which torch.compile's stream guards call, too)
        self.types = ("cuda", target.device_type)

    def index(self, device: Any, optional: bool) -> int:
        """What ``torch.accelerator._utils._get_device_index`` answers, a CUDA device included."""
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type not in self.types:
                raise ValueError(f"{device.type} doesn't match the current accelerator "
                                 f"(ascend_patch accepts {' or '.join(self.types)} devices; give 'cuda:N' "
                                 "or an index)")
            if device.index is not None:
                return device.index
        if not optional:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return self.dm.current_device()

    def functions(self) -> dict[str, Any]:
        """name -> replacement, for every function of ``torch.accelerator`` the target answers."""
        dm, acc = self.dm, self

        def is_available() -> bool:
            return acc.available

        def current_accelerator(check_available: bool = False) -> torch.device | None:
            return acc.cuda if acc.available else None

        def device_count() -> int:
            return dm.device_count() if acc.available else 0

        def current_device_index() -> int:
            return dm.current_device()

        def set_device_index(device: Any, /) -> None:
            dm.set_device(acc.index(device, optional=False))

        def get_device_capability(device: Any = None, /) -> dict[str, Any]:
            acc.index(device, optional=True)
            return {"supported_dtypes": set(_HOST_DTYPES)}

        def current_stream(device: Any = None, /) -> Any:
            return dm.current_stream(acc.index(device, optional=True))

        def set_stream(stream: Any) -> None:
            dm.set_stream(stream)

        def synchronize(device: Any = None, /) -> None:
            dm.synchronize(acc.index(device, optional=True))

        def memory(name: str) -> Any:
            def stat(device_index: Any = None, /) -> Any:
                return getattr(dm, name)(acc.index(device_index, optional=True))

            stat.__name__ = name
            return stat

        def empty_cache() -> None:
            dm.empty_cache()

        def empty_host_cache() -> None:
            return None

        def memory_stats(device_index: Any = None, /) -> Any:
            from collections import OrderedDict

            return OrderedDict(sorted(dm.memory_stats(acc.index(device_index, optional=True)).items()))

        def get_memory_info(device_index: Any = None, /) -> tuple[int, int]:
            return dm.mem_get_info(acc.index(device_index, optional=True))

        class device_index:
            """Sets the current virtual device for the block, as ``torch.accelerator.device_index`` does."""

            def __init__(self, device: int | None, /) -> None:
                self.idx = device
                self.prev_idx = -1

            def __enter__(self) -> None:
                if self.idx is not None:
                    self.prev_idx = dm.current_device()
                    dm.set_device(self.idx)

            def __exit__(self, *exc_info: object) -> None:
                if self.idx is not None:
                    dm.set_device(self.prev_idx)

        found = dict(locals())
        names = ["is_available", "current_accelerator", "device_count", "current_device_index",
                 "set_device_index", "get_device_capability", "current_stream", "set_stream", "synchronize",
                 "empty_cache", "empty_host_cache", "memory_stats", "get_memory_info", "device_index"]
        table = {name: found[name] for name in names}
        table["current_device_idx"] = current_device_index
        table["set_device_idx"] = set_device_index
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                     "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
            table[name] = memory(name)
        for fn in table.values():
            fn.__module__ = _MOD
        return table


_NOOPS = frozenset({"synchronize", "empty_cache", "empty_host_cache", "reset_accumulated_memory_stats"})


def _event_type(original: type, dmap: DeviceMap) -> type:
    """``torch.Event``: an event of the current accelerator (no device, or cuda) is the host's timed event."""
    from ...cpu_host import CpuEvent

    class _EventType(type):
        def __call__(cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                     interprocess: bool = False) -> Any:
            if device is None or dmap.lookup(device, ints=True) is not NOT_A_DEVICE:
                return CpuEvent(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
            return original(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, (original, CpuEvent))

        def __subclasscheck__(cls, sub: type) -> bool:
            return sub is cls or issubclass(sub, (original, CpuEvent))

    return _EventType("Event", (), {"__module__": "torch", "__qualname__": "Event",
                                    "__doc__": "torch.Event of the cpu target's accelerator: wall-clock timed."})


def _cpu_patches(target: Backend, settings: Settings, dmap: DeviceMap) -> list[Patch]:
    import torch.accelerator as accelerator

    available = settings.cuda_is_available

    def get_device_module(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        device = args[0] if args else kwargs.get("device")
        if device is None and available:
            return torch.cuda  # the current accelerator's module, as on a CUDA build
        return wrapped(*args, **kwargs)

    cpu_only = frozenset({"cpu"})
    patches: list[Patch] = [
        Wrap("torch:get_device_module", "no device: the current accelerator's module (torch.cuda)",
             wrapper=get_device_module, action=Action.EMULATED, count_calls=False, backends=cpu_only),
        Replace("torch:Event", "an event of the accelerator (no device, or cuda) times with the wall clock, as "
                "torch.cuda.Event does", make=lambda orig: _event_type(orig, dmap), action=Action.EMULATED,
                count_calls=False, backends=cpu_only)]
    for name, fn in Accelerator(target, settings).functions().items():
        if not hasattr(accelerator, name):
            continue  # an older torch without this function: nothing to answer
        action = Action.NOOP if name in _NOOPS else Action.EMULATED
        patches.append(Replace(f"{_MOD}:{name}", "the cpu target is the accelerator torch.cuda says it is",
                               replacement=fn, action=action, api=f"{_MOD}.{name}", backends=frozenset({"cpu"})))
    return patches


# what goes through torch.npu on the npu target (the current device is one runtime state)
NPU_THROUGH_DEVICE_MODULE = ("current_device_index", "current_device_idx", "set_device_index", "set_device_idx",
                              "device_index", "synchronize")


def _npu_patches(target: Backend, settings: Settings, dmap: DeviceMap) -> list[Patch]:
    import torch.accelerator as accelerator

    available = settings.cuda_is_available
    functions = Accelerator(target, settings).functions()
    patches: list[Patch] = [
        Replace(f"{_MOD}:{name}", "the current NPU is torch.npu's, as for torch.cuda.*", replacement=functions[name],
                action=Action.TRANSLATED, api=f"{_MOD}.{name}")
        for name in NPU_THROUGH_DEVICE_MODULE if hasattr(accelerator, name)]

    def get_device_index(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            args = (dmap(args[0], ints=False), *args[1:])
        return wrapped(*args, **kwargs)

    def is_available(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return available and wrapped(*args, **kwargs)

    return patches + [
        Wrap(f"{_MOD}._utils:_get_device_index", "a cuda device given to torch.accelerator names the NPU with the "
             "same index", wrapper=get_device_index, count_calls=False),
        Wrap(f"{_MOD}:is_available", "honours ASCEND_PATCH_CUDA_IS_AVAILABLE, as torch.cuda.is_available does",
             wrapper=is_available, action=Action.TRANSLATED, api=f"{_MOD}.is_available")]


def accelerator_patches(target: Backend, settings: Settings, dmap: DeviceMap) -> list[Patch]:
    """Patches that make ``torch.accelerator`` answer what the patched ``torch.cuda`` answers."""
    if target.name == "cpu":
        return _cpu_patches(target, settings, dmap)
    return _npu_patches(target, settings, dmap)
