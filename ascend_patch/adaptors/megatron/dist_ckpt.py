"""Older megatron-core's torch_dist checkpointing on today's torch and numpy (every save, any target)."""

from __future__ import annotations

from typing import Any

from ...patch import Action, Add, Patch, Replace
from .releases import needed_on

__all__ = ["dist_ckpt_patches", "write_item_adapter"]

_ASYNC = "megatron.core.dist_checkpointing.strategies.filesystem_async"


def write_item_adapter(original: Any) -> Any:
    """torch's ``_write_item`` as a release before 0.13 calls it.

    torch 2.13's ``_write_item(transforms, stream, data, write_item, storage_key, serialization_format)``
    needs the format (0.13 passes it when the signature has it); core_r0.8.0 also leaves out the
    transforms. Both are filled in with what torch's own writer passes: no transform, torch.save format.
    """
    from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageWriterTransforms

    def _write_item(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 4 and not isinstance(args[0], _StorageWriterTransforms):
            args = (_StorageWriterTransforms(), *args)  # (stream, data, write_item, storage_key)
        if len(args) < 6 and "serialization_format" not in kwargs:
            kwargs["serialization_format"] = SerializationFormat.TORCH_SAVE
        return original(*args, **kwargs)

    return _write_item


def _prod(original: Any) -> Any:
    import numpy

    return numpy.prod


def dist_ckpt_patches() -> list[Patch]:
    """The torch_dist save path of releases that call APIs torch 2.13 and numpy 2 changed."""
    return [
        Replace(f"{_ASYNC}:_write_item",
                "torch 2.13's _write_item needs serialization_format, which megatron-core before 0.13 does not pass: "
                "every torch_dist save failed in the writer process", make=write_item_adapter,
                action=Action.TRANSLATED, count_calls=False, rebind=False, **needed_on("write_item_without_format")),
        # numpy 2 removed numpy.product; the alias is added on numpy, reached through the module that uses it
        Add("megatron.core.dist_checkpointing.mapping:np.product",
            "numpy 2 removed numpy.product, which megatron-core before 0.16 calls in every torch_dist save "
            "and validation: numpy.prod under that name", make=_prod, action=Action.TRANSLATED, count_calls=False,
            rebind=False, **needed_on("numpy_product")),
    ]
