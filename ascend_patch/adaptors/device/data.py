"""Data loading and single-process data parallelism on the target.

* ``DataLoader(pin_memory=True, pin_memory_device="cuda")``: on npu the loader pins
  for the NPU (the device string is dropped: torch now derives it from the
  accelerator); on cpu there is no device memory to pin for, so pinning is switched
  off instead of warning on every loader.
* ``nn.DataParallel``: torch's own device-type probe answers the target; on cpu
  :mod:`.data_parallel` scatters over the virtual devices as N GPUs would.
* ``torch.set_default_device("cuda")`` sets the target through torch's ``DeviceContext``,
  which :mod:`.legacy` translates (one patch serves it and ``with torch.device(...)``).
"""

from __future__ import annotations

import inspect
from typing import Any

from ...backend import Backend
from ...patch import Action, Patch, Replace, replacing
from ...usage import note

__all__ = ["data_patches"]


def _dataloader_init(original: Any, on_cpu: bool) -> Any:
    signature = inspect.signature(original)

    @replacing(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        if arguments.get("pin_memory"):
            note("DataLoader(pin_memory=True)", Action.NOOP.value if on_cpu else Action.TRANSLATED.value)
            if on_cpu:
                arguments["pin_memory"] = False
        device = arguments.get("pin_memory_device")
        if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
            arguments["pin_memory_device"] = ""
        original(*bound.args, **bound.kwargs)

    return __init__


def data_patches(target: Backend) -> list[Patch]:
    on_cpu = target.name == "cpu"
    device_type = None if on_cpu else target.device_type

    def available_device_type() -> str | None:
        return device_type

    return [
        Replace("torch.utils.data.dataloader:DataLoader.__init__",
                "pin memory for the target (nothing to pin for on the host)",
                make=lambda orig: _dataloader_init(orig, on_cpu), count_calls=False),
        Replace("torch._utils:_get_available_device_type",
                "torch's accelerator probe (DataParallel) answers the target", replacement=available_device_type,
                action=Action.EMULATED, count_calls=False),
    ]
