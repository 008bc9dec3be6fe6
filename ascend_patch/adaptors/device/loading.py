"""``torch.load(map_location=...)``: checkpoints saved on ``cuda:N`` load on the target.

Every form torch accepts is handled: None (locations as saved), a str / torch.device /
int, a dict (listed locations remapped, unlisted CUDA ones onto the target too),
and a callable (whose ``None`` answer falls back to the target, as torch falls back
to the saved location). The path argument is never touched.
"""

from __future__ import annotations

from typing import Any

from ...patch import Patch, Wrap
from ...devices import NOT_A_DEVICE, DeviceMap

__all__ = ["load_patches", "translate_map_location"]


def translate_map_location(map_location: Any, dmap: DeviceMap) -> Any:
    """A map_location that sends CUDA storage locations onto the target."""
    from torch.serialization import default_restore_location

    if map_location is None:
        def restore(storage: Any, location: str) -> Any:
            return default_restore_location(storage, dmap.location(location))

        return restore
    if isinstance(map_location, dict):
        table = dict(map_location)

        def restore_dict(storage: Any, location: str) -> Any:
            return default_restore_location(storage, dmap.location(str(dmap(table.get(location, location)))))

        return restore_dict
    if callable(map_location):
        user = map_location

        def restore_callable(storage: Any, location: str) -> Any:
            result = user(storage, location)
            if result is None:
                return default_restore_location(storage, dmap.location(location))
            return result

        return restore_callable
    mapped = dmap.lookup(map_location)
    return map_location if mapped is NOT_A_DEVICE else mapped


def _load_wrapper(dmap: DeviceMap) -> Any:
    """A wrapt wrapper for ``torch.load(f, map_location=None, ...)``: only map_location changes."""

    def load(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > 1:
            args = (args[0], translate_map_location(args[1], dmap), *args[2:])
        else:
            kwargs["map_location"] = translate_map_location(kwargs.get("map_location"), dmap)
        return wrapped(*args, **kwargs)

    return load


def load_patches(dmap: DeviceMap) -> list[Patch]:
    return [Wrap("torch.serialization:load", "storages saved on cuda:N are restored onto the target",
                 wrapper=_load_wrapper(dmap), api="torch.load")]
