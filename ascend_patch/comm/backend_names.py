"""``nccl`` onto the target's collective backend wherever a process group is made.

``init_process_group(backend="nccl")`` and ``new_group(backend="nccl")`` become
``hccl`` on npu and ``gloo`` on cpu, including the per-device form
``"cpu:gloo,cuda:nccl"``. ``device_id=`` names a CUDA device; on npu it becomes the
NPU with the same index, on cpu it is dropped (gloo binds no device).
DistributedDataParallel's ``device_ids``/``output_device`` follow the same rule.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..backend import Backend
from ..patch import Patch, PatchKind
from ..devices import DeviceMap
from ..usage import note

__all__ = ["backend_name_patches", "translate_backend"]


def translate_backend(backend: Any, target: Backend) -> Any:
    """A ``backend=`` value with every ``nccl`` replaced by the target's collective backend."""
    if not isinstance(backend, str):
        return backend
    dist = target.dist_backend
    if backend.lower() == "nccl":
        return dist
    if ":" in backend:  # "cpu:gloo,cuda:nccl"
        parts: dict[str, str] = {}
        for item in backend.split(","):
            device, _, name = item.partition(":")
            device, name = device.strip(), name.strip()
            if name.lower() == "nccl":
                name = dist
            device = target.device_type if device == "cuda" else device
            parts.setdefault(device, name)  # cuda mapped onto cpu: the explicit cpu entry wins
        return ",".join(f"{d}:{n}" for d, n in parts.items())
    return backend


def _device_id(device_id: Any, target: Backend, dmap: DeviceMap) -> Any:
    if device_id is None:
        return None
    if target.name == "cpu":
        return None
    return dmap(device_id)


def _group_wrapper(original: Any, target: Backend, dmap: DeviceMap, api: str) -> Any:
    signature = inspect.signature(original)

    def make_group(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        arguments = bound.arguments
        backend = arguments.get("backend")
        translated = translate_backend(backend, target)
        if translated != backend:
            note(f"{api}(backend='nccl')")
            arguments["backend"] = translated
        if arguments.get("device_id") is not None:
            arguments["device_id"] = _device_id(arguments["device_id"], target, dmap)
        return original(*bound.args, **bound.kwargs)

    make_group.__wrapped__ = original  # type: ignore[attr-defined]
    make_group.__signature__ = signature  # type: ignore[attr-defined]
    make_group.__doc__ = original.__doc__
    return make_group


def _ddp_init(original: Any, target: Backend, dmap: DeviceMap) -> Any:
    signature = inspect.signature(original)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        ids = arguments.get("device_ids")
        if ids is not None:
            note("DistributedDataParallel(device_ids=...)")
            arguments["device_ids"] = None if target.name == "cpu" else [dmap(i) for i in ids]
        out = arguments.get("output_device")
        if out is not None:
            arguments["output_device"] = None if target.name == "cpu" else dmap(out)
        original(*bound.args, **bound.kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def backend_name_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    c10d = "torch.distributed.distributed_c10d"
    return [
        Patch(f"{c10d}:init_process_group", PatchKind.REPLACE,
              f"nccl -> {target.dist_backend}; device_id onto the target",
              make=lambda orig: _group_wrapper(orig, target, dmap, "torch.distributed.init_process_group"),
              count_calls=False),
        Patch(f"{c10d}:new_group", PatchKind.REPLACE, f"nccl -> {target.dist_backend}",
              make=lambda orig: _group_wrapper(orig, target, dmap, "torch.distributed.new_group"),
              count_calls=False),
        Patch("torch.nn.parallel.distributed:DistributedDataParallel.__init__", PatchKind.REPLACE,
              "device_ids/output_device onto the target (none on the host)",
              make=lambda orig: _ddp_init(orig, target, dmap), count_calls=False),
    ]
