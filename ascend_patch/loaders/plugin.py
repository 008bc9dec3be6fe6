"""The built-in checkpoint-format plugin: the ``hf`` and ``mg`` loaders and savers.

Imports nothing heavy: the format modules are imported when the hooks are called,
which happens only when a converter resolves a ``--loader`` / ``--saver`` name.
"""

from __future__ import annotations

from typing import Any

from ..hookspec import hookimpl

__all__ = ["ascend_patch_checkpoint_loaders", "ascend_patch_checkpoint_savers"]


@hookimpl
def ascend_patch_checkpoint_loaders() -> list[Any]:
    from .hf import HFLoader
    from .megatron import MegatronLoader
    from .torch_dist import TorchDistLoader

    return [HFLoader(), MegatronLoader(), TorchDistLoader()]


@hookimpl
def ascend_patch_checkpoint_savers() -> list[Any]:
    from .hf import HFSaver
    from .megatron import MegatronSaver
    from .torch_dist import TorchDistSaver

    return [HFSaver(), MegatronSaver(), TorchDistSaver()]
