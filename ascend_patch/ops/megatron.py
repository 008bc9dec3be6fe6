"""megatron-core 0.16's fused-op entry points, swapped for the target's implementations.

Only op entry points are patched here (the Megatron adaptor owns config flags, RNG and
the torch-norm path). Every patch is for ``megatron-core >=0.16,<0.17`` and waits for
its module to be imported:

* ``models.common.embeddings.rope_utils``: ``fused_apply_rotary_pos_emb`` and
  ``fused_apply_rotary_pos_emb_thd`` (None without Transformer Engine's fused RoPE, which the
  transformer_engine layer does not provide; ``apply_rope_fusion``
  asserts on them) -> :mod:`.rope`;
* ``fusions.fused_bias_swiglu:bias_swiglu_impl`` and ``fusions.fused_bias_gelu:bias_gelu_impl``
  (``torch.compile``-built) -> :mod:`.swiglu`;
* ``fusions.fused_softmax:FusedScaleMaskSoftmax.is_kernel_available`` /
  ``forward_fused_softmax`` (import the CUDA extension) -> :mod:`.softmax`.

megatron's fused layer norm needs no patch: ``fusions.fused_layer_norm`` imports
``FusedLayerNormAffineFunction`` / ``FastLayerNormFN`` from apex, and the apex shim serves
:mod:`.norm`'s. (Imported before ascend_patch, megatron's layer specs have already chosen
the torch norm, so patching the module afterwards would not reach them.)

The ``transformer_engine`` shim (the TE layer of :mod:`.te`) needs no megatron-core patch: megatron's
own TE wrappers build on it.
"""

from __future__ import annotations

from typing import Any

from ..patch import Action, Patch, Replace

__all__ = ["MEGATRON_RANGE", "megatron_patches"]

MEGATRON_RANGE = {"package": "megatron-core", "versions": ">=0.16,<0.17"}
_ROPE = "megatron.core.models.common.embeddings.rope_utils"
_SOFTMAX = "megatron.core.fusions.fused_softmax"


def megatron_patches(backend: Any) -> list[Patch]:
    """The Patch records for megatron-core's fused-op entry points on ``backend``."""
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED

    def rope(name: str) -> Any:
        from . import rope as mod

        return getattr(mod, name)(backend)

    def swiglu(name: str) -> Any:
        from . import swiglu as mod

        return getattr(mod, name)(backend)

    def softmax(name: str) -> Any:
        from . import softmax as mod

        return getattr(mod, name)(backend)

    def patch(target: str, reason: str, make: Any, **extra: Any) -> Replace:
        return Replace(target, reason, make=make, action=action, **MEGATRON_RANGE, **extra)

    return [
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb",
              "apply_rope_fusion needs TE's fused RoPE; use the target's (npu_rotary_mul / torch)",
              lambda _: rope("megatron_fused_apply_rotary_pos_emb")),
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb_thd",
              "apply_rope_fusion with packed sequences needs TE's fused RoPE; use the target's",
              lambda _: rope("megatron_fused_apply_rotary_pos_emb_thd")),
        patch("megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl",
              "bias-SwiGLU is built with torch.compile; use npu_swiglu / an eager fused function",
              lambda _: swiglu("megatron_bias_swiglu_impl")),
        patch("megatron.core.fusions.fused_bias_gelu:bias_gelu_impl",
              "bias-GeLU is built with torch.jit/compile; use torch's tanh gelu",
              lambda _: swiglu("megatron_bias_gelu_impl")),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.is_kernel_available",
              "asks the CUDA extension scaled_masked_softmax_cuda; answer for the target's kernel",
              lambda _: softmax("megatron_is_kernel_available")),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.forward_fused_softmax",
              "runs the CUDA extensions; use npu_scaled_masked_softmax / torch with the kernels' semantics",
              lambda _: softmax("megatron_forward_fused_softmax")),
    ]
