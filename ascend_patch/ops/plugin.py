"""The built-in ops plugin: shims for CUDA-only packages, and the fused-optimizer fallback on npu."""

from __future__ import annotations

from ..hookspec import Target, hookimpl
from ..patch import Patch

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(backend: Target) -> list[Patch]:
    from ..patch import Wrap
    from .optim import fused_optimizer_fallback
    from .shims import shim_patches

    # torch 2.13 runs fused=True on cpu for every float dtype (tests/ops check it), so only npu,
    # where torch_npu's coverage cannot be checked here, gets the probing fallback
    return [*shim_patches(backend),
            Wrap(target="torch.optim:Adam.__init__", wrapper=fused_optimizer_fallback,
                 backends=frozenset({"npu"}), count_calls=False,
                 reason="Adam/AdamW(fused=True): fall back to foreach where the target lacks the fused kernel")]
