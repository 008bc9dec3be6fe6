"""The built-in ops plugin: shims for CUDA-only packages, and the fused-optimizer fallback on npu."""

from __future__ import annotations

from ..hookspec import PatchSink, Target, hookimpl

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(registry: PatchSink, backend: Target) -> None:
    from ..patch import Wrap
    from .optim import fused_optimizer_fallback
    from .shims import shim_patches

    registry.extend(shim_patches(backend))
    # torch 2.13 runs fused=True on cpu for every float dtype (tests/ops check it), so only npu,
    # where torch_npu's coverage cannot be checked here, gets the probing fallback
    registry.add(Wrap(target="torch.optim:Adam.__init__", wrapper=fused_optimizer_fallback,
                      backends=frozenset({"npu"}), count_calls=False,
                      reason="Adam/AdamW(fused=True): fall back to foreach where the target lacks the fused kernel"))
