"""The built-in Megatron plugin: the patches stock megatron-core needs on the targets.

What the device and comm adaptors already cover is not repeated here (see
docs/megatron.md): ``torch.cuda.current_device()`` used as a device, literal
``device="cuda"``, ``torch.cuda.*FloatTensor`` type strings in the optimizers and
gradient clipping, ``torch.cuda.synchronize`` in pipeline p2p, ``.cuda()`` on tied
embeddings, and ``nccl`` process groups all work through those.
"""

from __future__ import annotations

from typing import Any

from ...hookspec import Target, hookimpl
from ...patch import Patch

__all__ = ["ascend_patch_register_patches", "megatron_patches"]


def megatron_patches(backend: Any) -> list[Any]:
    """Every Megatron patch for ``backend`` (the registry drops those for other targets)."""
    from . import fp8_config, fusions, jit, moe, norms, optimizer, p2p, rng, wgrad
    from .te.shims import te_shim_patches

    return [*jit.jit_patches(), *rng.rng_patches(), *norms.norm_patches(backend), *wgrad.wgrad_patches(),
            *optimizer.optimizer_patches(), *p2p.p2p_patches(),
            *fp8_config.te_patches(), *fusions.megatron_patches(backend), *te_shim_patches(backend),
            *moe.moe_patches(backend)]


@hookimpl
def ascend_patch_register_patches(backend: Target) -> list[Patch]:
    return megatron_patches(backend)
