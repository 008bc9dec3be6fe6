"""Fused-op adaptors: stock CUDA-only kernels on the target, one module per op family, no framework knowledge.

Each op reads its target at call time (:func:`ascend_patch.backend.current_target`): the torch_npu
kernel from its kernel table, else a pure-torch implementation with the stock op's semantics.
Nothing here is imported by ``import ascend_patch``; the plugin imports these modules in its hook.
"""

from __future__ import annotations

__all__ = [
    "attention",
    "attention_block",
    "attention_npu",
    "context_parallel",
    "grouped_gemm",
    "multi_tensor",
    "norm",
    "norm_apex",
    "norm_cuda",
    "optim",
    "plugin",
    "rope",
    "shims",
    "softmax",
    "swiglu",
]
