"""``torch.Generator(device="cuda")`` onto the target, with ``isinstance`` still true.

The replacement is a class whose metaclass builds real ``torch.Generator`` objects
and answers ``isinstance``/``issubclass`` for them, so type checks in torch and in
user code keep working.
"""

from __future__ import annotations

from typing import Any

import torch

from ...patch import Patch, Replace
from ...usage import active_recorder
from ...devices import NOT_A_DEVICE, DeviceMap

__all__ = ["generator_patches"]


def _generator_class(original: type, dmap: DeviceMap) -> type:
    recorder = active_recorder()

    class _GeneratorMeta(type):
        def __call__(cls, device: Any = "cpu") -> Any:
            mapped = dmap.lookup(device)
            if mapped is NOT_A_DEVICE:
                return original(device=device)
            if recorder is not None:
                recorder.hit("torch.Generator(device=cuda)", "translated")
            return original(device=mapped)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

        def __getattr__(cls, name: str) -> Any:
            return getattr(original, name)

    return _GeneratorMeta("Generator", (), {"__doc__": original.__doc__, "__module__": "torch",
                                            "__wrapped__": original})


def generator_patches(dmap: DeviceMap) -> list[Patch]:
    return [Replace("torch:Generator", "generators on the target device",
                    make=lambda orig: _generator_class(orig, dmap), api="torch.Generator",
                    count_calls=False)]
