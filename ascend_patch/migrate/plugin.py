"""The built-in plugin ``migrate``: MindSpeed-LLM launch flags accepted by Megatron-LM's own parse_args.

On by default and inert for stock command lines (see :mod:`.inprocess`); turn it off with
``ASCEND_PATCH_DISABLE_PLUGINS=migrate``. It also contributes the built-in migration table through
``ascend_patch_migrate_flags``, as a third-party plugin would. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..hookspec import hookimpl
from ..patch import Action, Patch, Wrap

__all__ = ["ascend_patch_checkpoint_loaders", "ascend_patch_migrate_flags", "ascend_patch_register_patches",
           "migrate_patches"]


def migrate_patches(backend: Any, settings: Any = None) -> list[Patch]:
    """The patch records of the in-process translation (the same on every target).

    The translation itself is per release (the table's facts); the patch is needed on every release.
    """
    from ..adaptors.megatron.releases import needed_on
    from . import inprocess

    return [Wrap("megatron.training.arguments:parse_args",
                 "a MindSpeed-LLM launch (flags or values stock Megatron-LM rejects) is translated with the migration "
                 "table for the imported megatron-core release before Megatron parses it; refused flags stop the run",
                 wrapper=inprocess.parse_args, action=Action.TRANSLATED, count_calls=False,
                 **needed_on())]


@hookimpl
def ascend_patch_register_patches(backend: Any, settings: Any) -> Iterable[Patch]:
    return migrate_patches(backend, settings)


@hookimpl
def ascend_patch_migrate_flags() -> Iterable[Any]:
    from .table import FLAGS

    return FLAGS


@hookimpl
def ascend_patch_checkpoint_loaders() -> Iterable[Any]:
    from .checkpoint import MindSpeedLLMLoader

    return [MindSpeedLLMLoader()]
