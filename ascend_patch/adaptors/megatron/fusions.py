"""megatron-core's fused-op entry points, swapped for the target's implementations.

Only op entry points are patched here (the Megatron adaptor owns config flags, RNG and
the torch-norm path). Every supported release needs them (the replacements take the arguments of every
release: main's ``interleaved=`` and ``clamp_value``), and each waits for its module to be imported:

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
from typing import TYPE_CHECKING, Any

from ...patch import Action, Patch, Replace
from .releases import needed_on

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["bias_gelu_impl", "bias_swiglu_impl", "forward_fused_softmax", "fused_apply_rotary_pos_emb",
           "fused_apply_rotary_pos_emb_thd", "is_kernel_available", "megatron_patches"]

_ROPE = "megatron.core.models.common.embeddings.rope_utils"
_SOFTMAX = "megatron.core.fusions.fused_softmax"


def fused_apply_rotary_pos_emb(t: Tensor, freqs: Tensor, transpose_output_memory: bool = False,
                               interleaved: bool = False) -> Tensor:
    """``rope_utils.fused_apply_rotary_pos_emb(t, freqs, transpose_output_memory=False, interleaved=False)``."""
    from ...ops import rope

    if transpose_output_memory:
        warnings.warn("transpose_output_memory is not supported by the fused RoPE and will be ignored.",
                      stacklevel=2)
    return rope.fused_rope_sbhd(t, freqs, interleaved)


def fused_apply_rotary_pos_emb_thd(t: Tensor, cu_seqlens: Tensor, freqs: Tensor, cp_size: int = 1,
                                   cp_rank: int = 0, interleaved: bool = False) -> Tensor:
    """``rope_utils.fused_apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_size=1, cp_rank=0, interleaved=False)``
    (releases before main pass no ``interleaved``; main passes ``config.rotary_interleaved``)."""
    from ...ops import rope

    return rope.fused_rope_thd(t, cu_seqlens, freqs, cp_size, cp_rank, interleaved)


def bias_swiglu_impl(input: Tensor, bias: Tensor | None, fp8_input_store: bool = False,
                     cpu_offload_input: bool = False, clamp_value: float | None = None) -> Tensor:
    """``megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl`` on the current target (``clamp_value``:
    main's clamped SwiGLU, passed positionally by its MLP; releases before main pass four arguments)."""
    from ...ops import swiglu

    ori_shape = input.shape
    assert len(ori_shape) in [2, 3]
    out = swiglu.bias_swiglu(input.view(-1, ori_shape[-1]), bias, fp8_input_store, cpu_offload_input, clamp_value)
    return out if len(ori_shape) == 2 else out.view(ori_shape[0], ori_shape[1], -1)


def bias_gelu_impl(input: Tensor, bias: Tensor) -> Tensor:
    """``megatron.core.fusions.fused_bias_gelu.bias_gelu_impl`` on the current target."""
    from ...ops import swiglu

    return swiglu.bias_gelu(input, bias)


def is_kernel_available(self: Any, mask: Tensor | None, b: int, np: int, sq: int, sk: int) -> bool:
    """``FusedScaleMaskSoftmax.is_kernel_available``, answered for the current target's implementation."""
    from ...ops import softmax

    if not (self.scaled_masked_softmax_fusion and self.input_in_float16):
        return False
    if getattr(self, "window_size", None) is not None:
        return False  # the fused kernels have no sliding window; megatron's torch path has
    if getattr(self.attn_mask_type, "name", "") == "causal" and sq != sk:
        return False
    if softmax.softmax_kernel() is not None:
        return softmax.npu_softmax_shape_ok(sq, sk)
    return True


def forward_fused_softmax(self: Any, input: Tensor, mask: Tensor | None) -> Tensor:
    """``FusedScaleMaskSoftmax.forward_fused_softmax`` on the current target (causal, masked or plain)."""
    from ...ops import softmax

    b, np, sq, sk = input.size()
    scale = self.scale if self.scale is not None else 1.0
    if getattr(self.attn_mask_type, "name", "") == "causal":
        assert sq == sk, "causal mask is only for self attention"
        return softmax.scaled_masked_softmax(input, None, scale, causal=True)
    return softmax.scaled_masked_softmax(input, mask, scale)


def megatron_patches(backend: Any) -> list[Patch]:
    """The Patch records for megatron-core's fused-op entry points (``backend`` decides the reported action)."""
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED

    def patch(target: str, reason: str, replacement: Any) -> Replace:
        return Replace(target, reason, replacement=replacement, action=action, **needed_on())

    return [
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb",
              "apply_rope_fusion needs TE's fused RoPE; use the target's (npu_rotary_mul / torch)",
              fused_apply_rotary_pos_emb),
        patch(f"{_ROPE}:fused_apply_rotary_pos_emb_thd",
              "apply_rope_fusion with packed sequences needs TE's fused RoPE; use the target's",
              fused_apply_rotary_pos_emb_thd),
        patch("megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl",
              "bias-SwiGLU is built with torch.compile; use npu_swiglu / an eager fused function",
              bias_swiglu_impl),
        patch("megatron.core.fusions.fused_bias_gelu:bias_gelu_impl",
              "bias-GeLU is built with torch.jit/compile; use torch's tanh gelu",
              bias_gelu_impl),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.is_kernel_available",
              "asks the CUDA extension scaled_masked_softmax_cuda; answer for the target's kernel",
              is_kernel_available),
        patch(f"{_SOFTMAX}:FusedScaleMaskSoftmax.forward_fused_softmax",
              "runs the CUDA extensions; use npu_scaled_masked_softmax / torch with the kernels' semantics",
              forward_fused_softmax),
    ]
