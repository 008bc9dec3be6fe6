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

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...patch import Action, Patch, Replace
from .releases import needed_on

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["megatron_bias_gelu_impl", "megatron_bias_swiglu_impl", "megatron_forward_fused_softmax",
           "megatron_fused_apply_rotary_pos_emb", "megatron_fused_apply_rotary_pos_emb_thd",
           "megatron_is_kernel_available", "megatron_patches"]

_ROPE = "megatron.core.models.common.embeddings.rope_utils"
_SOFTMAX = "megatron.core.fusions.fused_softmax"


def megatron_fused_apply_rotary_pos_emb(backend: Any) -> Callable[..., Tensor]:
    """``rope_utils.fused_apply_rotary_pos_emb(t, freqs, transpose_output_memory=False, interleaved=False)``."""
    from ...ops import rope

    def fused_apply_rotary_pos_emb(t: Tensor, freqs: Tensor, transpose_output_memory: bool = False,
                                   interleaved: bool = False) -> Tensor:
        if transpose_output_memory:
            warnings.warn("transpose_output_memory is not supported by the fused RoPE and will be ignored.",
                          stacklevel=2)
        return rope.fused_rope_sbhd(t, freqs, interleaved, backend=backend)

    return fused_apply_rotary_pos_emb


def megatron_fused_apply_rotary_pos_emb_thd(backend: Any) -> Callable[..., Tensor]:
    """``rope_utils.fused_apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_size=1, cp_rank=0)``."""
    from ...ops import rope

    def fused_apply_rotary_pos_emb_thd(t: Tensor, cu_seqlens: Tensor, freqs: Tensor, cp_size: int = 1,
                                       cp_rank: int = 0) -> Tensor:
        return rope.fused_rope_thd(t, cu_seqlens, freqs, cp_size, cp_rank, backend=backend)

    return fused_apply_rotary_pos_emb_thd


def megatron_bias_swiglu_impl(backend: Any) -> Callable[..., Tensor]:
    """``megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl`` for ``backend``."""
    from ...ops import swiglu

    def bias_swiglu_impl(input: Tensor, bias: Tensor | None, fp8_input_store: bool = False,
                         cpu_offload_input: bool = False) -> Tensor:
        ori_shape = input.shape
        assert len(ori_shape) in [2, 3]
        out = swiglu.bias_swiglu(input.view(-1, ori_shape[-1]), bias, fp8_input_store, cpu_offload_input, backend=backend)
        return out if len(ori_shape) == 2 else out.view(ori_shape[0], ori_shape[1], -1)

    return bias_swiglu_impl


def megatron_bias_gelu_impl(backend: Any) -> Callable[[Tensor, Tensor], Tensor]:
    """``megatron.core.fusions.fused_bias_gelu.bias_gelu_impl`` for ``backend``."""
    from ...ops import swiglu

    def bias_gelu_impl(input: Tensor, bias: Tensor) -> Tensor:
        return swiglu.bias_gelu(input, bias, backend=backend)

    return bias_gelu_impl


def megatron_is_kernel_available(backend: Any) -> Callable[..., bool]:
    """``FusedScaleMaskSoftmax.is_kernel_available`` that answers for the target's implementation."""
    from ...ops import softmax

    def is_kernel_available(self: Any, mask: Tensor | None, b: int, np: int, sq: int, sk: int) -> bool:
        if not (self.scaled_masked_softmax_fusion and self.input_in_float16):
            return False
        if getattr(self, "window_size", None) is not None:
            return False  # the fused kernels have no sliding window; megatron's torch path has
        if getattr(self.attn_mask_type, "name", "") == "causal" and sq != sk:
            return False
        if softmax.softmax_kernel(backend) is not None:
            return softmax.npu_softmax_shape_ok(sq, sk)
        return True

    return is_kernel_available


def megatron_forward_fused_softmax(backend: Any) -> Callable[..., Tensor]:
    """``FusedScaleMaskSoftmax.forward_fused_softmax`` on the target (causal, masked or plain)."""
    from ...ops import softmax

    def forward_fused_softmax(self: Any, input: Tensor, mask: Tensor | None) -> Tensor:
        b, np, sq, sk = input.size()
        scale = self.scale if self.scale is not None else 1.0
        if getattr(self.attn_mask_type, "name", "") == "causal":
            assert sq == sk, "causal mask is only for self attention"
            return softmax.scaled_masked_softmax(input, None, scale, causal=True, backend=backend)
        return softmax.scaled_masked_softmax(input, mask, scale, backend=backend)

    return forward_fused_softmax


def megatron_patches(backend: Any) -> list[Patch]:
    """The Patch records for megatron-core's fused-op entry points on ``backend``."""
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED

    def rope(name: str) -> Any:
        from ...ops import rope as mod

        return getattr(mod, name)(backend)

    def swiglu(name: str) -> Any:
        from ...ops import swiglu as mod

        return getattr(mod, name)(backend)

    def softmax(name: str) -> Any:
        from ...ops import softmax as mod

        return getattr(mod, name)(backend)

    def patch(target: str, reason: str, make: Any, **extra: Any) -> Replace:
        return Replace(target, reason, make=make, action=action, **needed_on(), **extra)

    return [
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb",
              "apply_rope_fusion needs TE's fused RoPE; use the target's (npu_rotary_mul / torch)",
              lambda _: megatron_fused_apply_rotary_pos_emb(backend)),
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb_thd",
              "apply_rope_fusion with packed sequences needs TE's fused RoPE; use the target's",
              lambda _: megatron_fused_apply_rotary_pos_emb_thd(backend)),
        patch("megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl",
              "bias-SwiGLU is built with torch.compile; use npu_swiglu / an eager fused function",
              lambda _: megatron_bias_swiglu_impl(backend)),
        patch("megatron.core.fusions.fused_bias_gelu:bias_gelu_impl",
              "bias-GeLU is built with torch.jit/compile; use torch's tanh gelu",
              lambda _: megatron_bias_gelu_impl(backend)),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.is_kernel_available",
              "asks the CUDA extension scaled_masked_softmax_cuda; answer for the target's kernel",
              lambda _: megatron_is_kernel_available(backend)),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.forward_fused_softmax",
              "runs the CUDA extensions; use npu_scaled_masked_softmax / torch with the kernels' semantics",
              lambda _: megatron_forward_fused_softmax(backend)),
    ]
