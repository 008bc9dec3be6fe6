"""Fused-op adaptors: stock CUDA-only kernels (apex, flash-attn, Transformer Engine, Megatron fusions) on the target.

One module per op family, each with the stock API surface it adapts, a pure-torch
implementation with the stock op's semantics (the cpu path) and the npu path, which
calls the torch_npu kernel taken from the backend's kernel table at call time:

* :mod:`.attention` / :mod:`.attention_npu` - flash-attn 2 (``flash_attn_func`` ...)
* :mod:`.context_parallel` / :mod:`.attention_block` - context-parallel attention (p2p ring,
  all_gather, a2a, a2a+p2p) on Megatron's load-balanced sequence split
* :mod:`.te` - the Transformer-Engine-compatible layer (``transformer_engine`` shim)
* :mod:`.optim` - apex / Transformer Engine FusedAdam, FusedSGD
* :mod:`.norm` / :mod:`.norm_apex` - layer/RMS norm, apex's norm modules, ``fused_layer_norm_cuda``
* :mod:`.rope` - flash-attn ``apply_rotary_emb``, megatron-core fused RoPE
* :mod:`.swiglu` - SwiGLU, bias-SwiGLU, bias-GeLU
* :mod:`.softmax` - megatron's fused scale-mask-softmax
* :mod:`.multi_tensor` - ``multi_tensor_applier`` and the ``amp_C`` ops
* :mod:`.grouped_gemm` - the MoE experts' grouped GEMM (``npu_grouped_matmul`` / a loop of matmuls)
* :mod:`.shims` - the shim modules; :mod:`.megatron` - megatron-core patches;
  :mod:`.plugin` - the built-in plugin that registers both.

Nothing here is imported by ``import ascend_patch``; the plugin imports these
modules inside its hook.
"""

from __future__ import annotations

__all__ = [
    "attention",
    "attention_block",
    "attention_npu",
    "context_parallel",
    "grouped_gemm",
    "megatron",
    "multi_tensor",
    "norm",
    "norm_apex",
    "optim",
    "rope",
    "shims",
    "softmax",
    "swiglu",
    "te",
]
