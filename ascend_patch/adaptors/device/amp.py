"""Mixed precision: ``torch.autocast("cuda")``, ``torch.cuda.amp``, ``GradScaler("cuda")``.

CUDA's semantics are kept: ``autocast("cuda")`` without a dtype means float16 (the
cpu target's own default would be bfloat16), the CUDA query/set functions
(``is_autocast_enabled()``, ``get_autocast_gpu_dtype()``, ...) act on the target,
and ``custom_fwd(device_type="cuda")`` casts inside the target's autocast region.
"""

from __future__ import annotations

from typing import Any

import torch

from ...backend import Backend
from ...patch import Patch, Replace, replacing
from ...usage import note
from ...devices import DeviceMap

__all__ = ["amp_patches"]


class _GpuDtype:
    """The autocast dtype CUDA code set or expects (float16 unless changed)."""

    def __init__(self) -> None:
        self.dtype = torch.float16


def _is_cuda(device_type: Any) -> bool:
    return device_type == "cuda"


def amp_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    dev = target.device_type
    gpu = _GpuDtype()

    def autocast_init(original: Any) -> Any:
        @replacing(original)
        def __init__(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
                     cache_enabled: Any = None) -> None:
            if _is_cuda(device_type):
                note("torch.autocast('cuda')")
                device_type = dev
                if dtype is None:
                    dtype = gpu.dtype
            original(self, device_type, dtype, enabled, cache_enabled)

        return __init__

    def is_autocast_enabled(original: Any) -> Any:
        def is_enabled(*args: Any) -> bool:
            if not args or _is_cuda(args[0]):
                note("torch.is_autocast_enabled('cuda')")
                return original(dev)
            return original(*args)

        return is_enabled

    def set_autocast_enabled(original: Any) -> Any:
        def set_enabled(*args: Any) -> None:
            if len(args) == 1:
                return original(dev, args[0])
            device_type, enabled = args
            return original(dev if _is_cuda(device_type) else device_type, enabled)

        return set_enabled

    def get_autocast_dtype(original: Any) -> Any:
        def get_dtype(device_type: str) -> Any:
            if _is_cuda(device_type):
                return original(dev) if torch.is_autocast_enabled(dev) else gpu.dtype
            return original(device_type)

        return get_dtype

    def set_autocast_dtype(original: Any) -> Any:
        def set_dtype(device_type: str, dtype: Any) -> None:
            if _is_cuda(device_type):
                gpu.dtype = dtype
                return original(dev, dtype)
            return original(device_type, dtype)

        return set_dtype

    def get_gpu_dtype() -> Any:
        return torch.get_autocast_dtype("cuda")

    def set_gpu_dtype(dtype: Any) -> None:
        torch.set_autocast_dtype("cuda", dtype)

    def is_available(original: Any) -> Any:
        def available(device_type: str) -> bool:
            return original(dev if _is_cuda(device_type) else device_type)

        return available

    def custom(original: Any) -> Any:
        @replacing(original)
        def decorator(fwd: Any = None, *, device_type: str, **kwargs: Any) -> Any:
            if _is_cuda(device_type):
                note(f"torch.amp.{original.__name__}(device_type='cuda')")
            return original(fwd, device_type=dmap.device_type_name(device_type), **kwargs)

        return decorator

    def scaler_init(original: Any) -> Any:
        @replacing(original)
        def __init__(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
            if _is_cuda(device):
                note("torch.amp.GradScaler('cuda')")
            original(self, dmap.device_type_name(device), *args, **kwargs)

        return __init__

    why = "CUDA autocast onto the target, keeping CUDA's float16 default"
    return [
        Replace("torch.amp.autocast_mode:autocast.__init__", why, make=autocast_init,
                api="torch.autocast('cuda')", count_calls=False),
        Replace("torch:is_autocast_enabled", why, make=is_autocast_enabled, count_calls=False),
        Replace("torch:set_autocast_enabled", why, make=set_autocast_enabled, count_calls=False),
        Replace("torch:get_autocast_dtype", why, make=get_autocast_dtype, count_calls=False),
        Replace("torch:set_autocast_dtype", why, make=set_autocast_dtype, count_calls=False),
        Replace("torch:get_autocast_gpu_dtype", why, replacement=get_gpu_dtype),
        Replace("torch:set_autocast_gpu_dtype", why, replacement=set_gpu_dtype),
        Replace("torch.amp.autocast_mode:is_autocast_available", why, make=is_available, count_calls=False),
        Replace("torch.amp.autocast_mode:custom_fwd", why, make=custom,
                api="torch.amp.custom_fwd(device_type='cuda')", count_calls=False),
        Replace("torch.amp.autocast_mode:custom_bwd", why, make=custom,
                api="torch.amp.custom_bwd(device_type='cuda')", count_calls=False),
        Replace("torch.amp.grad_scaler:GradScaler.__init__",
                "gradient scaling on the target", make=scaler_init, api="torch.amp.GradScaler('cuda')",
                count_calls=False),
    ]
