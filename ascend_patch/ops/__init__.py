"""Fused-op adaptors: stock CUDA-only kernels on the target, one module per op family, no framework knowledge.

Each op reads its target when called (:func:`ascend_patch.backend.current_target`); the plugin imports them.
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
