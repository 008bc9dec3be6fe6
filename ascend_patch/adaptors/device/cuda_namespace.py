"""``torch.cuda.*`` onto the target's device module, name for name.

The names come from ``torch.cuda.__all__`` (so a new torch release is covered):
each one the target's device module provides is replaced by it (``torch.npu`` on
npu; :class:`ascend_patch.cpu_device.CpuDeviceModule` on cpu); each callable it
does not provide raises :class:`UnsupportedOnTarget` naming the API and the target.
Legacy tensor/storage type objects, exception classes and submodules are left as
they are (``torch.cuda.amp`` works through the autocast/GradScaler adaptors).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ...backend import Backend, UnsupportedOnTarget
from ...config import Settings
from ...cpu_device import nvtx
from ...patch import Action, Patch, Replace

__all__ = ["cuda_namespace_patches", "unsupported", "UnsupportedOnTarget"]

_MISSING = object()

# Why a CUDA API has no counterpart, for the error message.
_WHY = {
    "CUDAGraph": "CUDA graphs capture GPU kernel launches; run the code eagerly",
    "graph": "CUDA graphs capture GPU kernel launches; run the code eagerly",
    "graph_pool_handle": "CUDA graphs capture GPU kernel launches; run the code eagerly",
    "make_graphed_callables": "CUDA graphs capture GPU kernel launches; call the callables directly",
    "ExternalStream": "there is no external CUDA stream to wrap",
    "cudart": "there is no CUDA runtime",
    "check_error": "there is no CUDA runtime",
    "MemPool": "the caching allocator's memory pools do not exist on this target",
    "use_mem_pool": "the caching allocator's memory pools do not exist on this target",
}
_DEFAULT_WHY = "this CUDA API has no counterpart on the target"
# Private names code outside torch relies on (Megatron's RNG tracker calls _lazy_call).
_PRIVATE = ("_lazy_call",)
_NVTX = ("range_push", "range_pop", "range_start", "range_end", "mark", "range")


def unsupported(api: str, target: str, obj: Any = None) -> Any:
    """A stand-in for ``api`` that raises UnsupportedOnTarget when used."""
    why = _WHY.get(api.rsplit(".", 1)[-1], _DEFAULT_WHY)
    message = f"{api} is not supported on the {target} target: {why}"
    if isinstance(obj, type):
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            raise UnsupportedOnTarget(message)

        return type(obj.__name__, (), {"__init__": __init__, "__doc__": message,
                                       "__module__": "torch.cuda", "__ascend_unsupported__": True})

    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOnTarget(message)

    raiser.__name__ = api.rsplit(".", 1)[-1]
    raiser.__doc__ = message
    raiser.__ascend_unsupported__ = True  # type: ignore[attr-defined]
    return raiser


def _no_devices() -> int:
    return 0


def _is_legacy_type(name: str, obj: Any) -> bool:
    return name.endswith(("Tensor", "Storage")) and (isinstance(obj, type) or type(obj).__name__ == "tensortype")


def cuda_namespace_patches(target: Backend, settings: Settings) -> list[Patch]:
    """REPLACE patches for every public ``torch.cuda`` name, plus nvtx and ``_lazy_call``."""
    dm = target.device_module
    provided_action = Action.TRANSLATED if target.name != "cpu" else Action.EMULATED
    patches: list[Patch] = []
    available = settings.cuda_is_available
    names = [n for n in torch.cuda.__all__ if n != "is_available"] + list(_PRIVATE)
    for name in names:
        obj = getattr(torch.cuda, name, _MISSING)
        if obj is _MISSING or isinstance(obj, types.ModuleType) or _is_legacy_type(name, obj):
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        api = f"torch.cuda.{name}"
        provided = getattr(dm, name, _MISSING)
        if provided is obj:
            continue  # already what the target says (has_half = True)
        if provided is not _MISSING and name == "device_count" and not available:
            # as on a machine without a GPU, and as torch.accelerator answers: no devices
            patches.append(Replace("torch.cuda:device_count", "0: CUDA is reported unavailable "
                                   "(ASCEND_PATCH_CUDA_IS_AVAILABLE=0)", replacement=_no_devices,
                                   action=Action.EMULATED, api=api))
        elif provided is not _MISSING:
            action = Action(getattr(provided, "__ascend_action__", provided_action.value))
            patches.append(Replace(f"torch.cuda:{name}",
                                   f"onto {target.name}'s device module", replacement=provided,
                                   action=action, api=api))
        elif callable(obj):
            patches.append(Replace(f"torch.cuda:{name}",
                                   f"no {target.name} counterpart: raises naming the API",
                                   replacement=unsupported(api, target.name, obj),
                                   action=Action.UNSUPPORTED, api=api))

    def is_available() -> bool:
        return available

    patches.append(Replace("torch.cuda:is_available",
                           "CUDA code paths run on the target (ASCEND_PATCH_CUDA_IS_AVAILABLE)",
                           replacement=is_available, action=Action.EMULATED, api="torch.cuda.is_available"))
    for name in _NVTX:
        patches.append(Replace(f"torch.cuda.nvtx:{name}",
                               "nvtx ranges become profiler ranges (torch.profiler.record_function)",
                               replacement=getattr(nvtx, name), action=Action.EMULATED,
                               api=f"torch.cuda.nvtx.{name}"))
    return patches
