"""``gradient_accumulation_fusion`` without apex's ``fused_weight_gradient_mlp_cuda``.

With the fusion on, megatron-core's linear layers skip autograd's weight gradient and
accumulate it straight into the DDP buffer's ``main_grad`` (saving one [out, in]
temporary and an add per linear per microbatch). The CUDA extension provides two GEMMs
that accumulate in place: ``wgrad_gemm_accum_fp32(input, grad_output, main_grad)`` for an
fp32 ``main_grad`` (inputs fp32/bf16/fp16) and ``wgrad_gemm_accum_fp16`` for a 16-bit one.
On the targets both are one in-place ``addmm_`` (a native accumulate-GEMM on cpu and on
npu); 16-bit inputs are widened when ``main_grad`` is fp32, because the extension
accumulates their product in fp32 too.

The shim module is served only while apex's extension is not installed. megatron-core
probes for it when ``megatron.core.tensor_parallel.layers`` is imported; if that happened
before the patch, the module's flag and name are set too.
"""

from __future__ import annotations

import sys
from typing import Any

from ...patch import Action, Add, ModuleShim, Patch, Replace
from ...shim import ShimBuilder, ShimSpec, ShimTable
from .releases import needed_on

__all__ = ["FUSED_WEIGHT_GRADIENT_MLP_CUDA", "MODULE_NAME", "wgrad_gemm_accum", "wgrad_patches"]

MODULE_NAME = "fused_weight_gradient_mlp_cuda"


def wgrad_gemm_accum(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    """``main_grad += grad_output^T @ total_input`` in place (2-D inputs, [n, in] and [n, out])."""
    if total_input.dim() != 2 or grad_output.dim() != 2:
        raise ValueError(f"{MODULE_NAME}: expected 2-D input and grad_output, got "
                         f"{tuple(total_input.shape)} and {tuple(grad_output.shape)}")
    dtype = main_grad.dtype
    if grad_output.dtype != dtype:
        grad_output = grad_output.to(dtype)
    if total_input.dtype != dtype:
        total_input = total_input.to(dtype)
    main_grad.addmm_(grad_output.t(), total_input)


FUSED_WEIGHT_GRADIENT_MLP_CUDA: ShimTable = {
    MODULE_NAME: ShimSpec(
        "in-place weight-gradient accumulation (apex's extension is not installed)",
        {name: "ascend_patch.adaptors.megatron.wgrad:wgrad_gemm_accum"
         for name in ("wgrad_gemm_accum_fp32", "wgrad_gemm_accum_fp16")},
        hints={"*": "only wgrad_gemm_accum_fp32 and wgrad_gemm_accum_fp16 exist"}),
}


def wgrad_patches() -> list[Patch]:
    """The extension's shim, and megatron-core's probe for it answered where it ran before the shim existed."""
    layers = "megatron.core.tensor_parallel.layers"
    shims = ShimBuilder(FUSED_WEIGHT_GRADIENT_MLP_CUDA)

    def module_object(_original: Any) -> Any:
        return sys.modules.get(MODULE_NAME) or shims.module(MODULE_NAME)

    return [
        ModuleShim(MODULE_NAME, "gradient_accumulation_fusion: in-place addmm_ into main_grad",
                   make=shims, action=Action.TRANSLATED, api=MODULE_NAME),
        Replace(f"{layers}:_grad_accum_fusion_available",
                "gradient_accumulation_fusion: megatron's import-time probe for apex's extension answers "
                "yes (also when megatron-core was imported before the shim existed)", make=lambda original: True,
                **needed_on(),  count_calls=False),
        Add(f"{layers}:{MODULE_NAME}",
            "gradient_accumulation_fusion: the extension module, where megatron-core was imported before "
            "the shim existed", make=module_object,
            **needed_on(),  count_calls=False),
    ]
