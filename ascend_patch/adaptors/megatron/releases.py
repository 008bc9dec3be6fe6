"""What depends on the Megatron release, as data: the one place a megatron-core version is written."""

from __future__ import annotations

__all__ = ["COMPILED_AT_IMPORT", "FACTS", "PACKAGE", "SUPPORTED", "TRITON_IMPORTERS", "patch_range"]

PACKAGE = "megatron-core"
SUPPORTED = ">=0.16,<0.17"  # the releases every Megatron patch was checked against


# What differs between releases, as the megatron-core releases that have it (a PEP 440 range); code
# names a fact instead of writing a version.
FACTS: dict[str, str] = {
    # --moe-token-dispatcher-type alltoall_seq (removed in 0.13)
    "alltoall_seq_dispatcher": "<0.13",
    # --pipeline-model-parallel-layout (layers per (virtual) stage as a string)
    "pipeline_layout_flag": ">=0.13",
    # --padded-vocab-size
    "padded_vocab_size_flag": ">=0.14",
    # --overlap-moe-expert-parallel-comm
    "moe_ep_overlap_flag": ">=0.14",
    # a switch between the fast and the slow HF tokenizer
    "hf_tokenizer_fast_switch": ">=0.16",
    # --tokenizer-hf-use-fast, off by default: pretrain_gpt.py's data-set tokenizer is the slow one
    "tokenizer_hf_use_fast_flag": ">=0.16,<0.17",
    # --tokenizer-hf-no-use-fast (fast by default)
    "tokenizer_hf_no_use_fast_flag": ">=0.17",
}


def patch_range() -> dict[str, str]:
    """``package=`` and ``versions=`` for a Patch record that reaches into megatron-core."""
    return {"package": PACKAGE, "versions": SUPPORTED}


# (module, attribute) of every function megatron-core passes through jit_fuser at import;
# tests/megatron/test_mcore_patches.py checks the list against a scan of the installed package.
COMPILED_AT_IMPORT: tuple[tuple[str, str], ...] = tuple(
    (module, name) for module, names in {
        "megatron.core.activations": ("fast_gelu", "quick_gelu", "squared_relu"),
        "megatron.core.fusions.fused_bias_dropout": ("bias_dropout_add_fused_inference",
                                                     "bias_dropout_add_fused_train"),
        "megatron.core.fusions.fused_bias_geglu": (
            "bias_geglu", "bias_geglu_back", "geglu", "geglu_back", "quick_geglu", "quick_geglu_back",
            "quick_gelu", "weighted_bias_quick_geglu", "weighted_bias_quick_geglu_back",
            "weighted_quick_geglu", "weighted_quick_geglu_back"),
        "megatron.core.fusions.fused_bias_gelu": ("bias_gelu", "bias_gelu_back"),
        "megatron.core.fusions.fused_bias_swiglu": ("bias_swiglu", "bias_swiglu_back", "swiglu", "swiglu_back",
                                                    "weighted_swiglu", "weighted_swiglu_back"),
        "megatron.core.fusions.fused_cross_entropy": ("calculate_cross_entropy_loss", "calculate_gradients",
                                                      "calculate_logits_max", "calculate_predicted_logits"),
        "megatron.core.fusions.fused_pad_routing_map": ("fused_pad_routing_map",),
        "megatron.core.fusions.fused_weighted_squared_relu": ("_squared_relu_back", "weighted_squared_relu",
                                                              "weighted_squared_relu_back"),
        "megatron.core.ssm.gated_delta_net": ("GatedDeltaNet._apply_gated_norm",),
        "megatron.core.transformer.attention": ("Attention._apply_output_gate",),
        "megatron.core.transformer.moe.router": ("TopKRouter._apply_expert_bias",),
        "megatron.core.transformer.moe.token_dispatcher": ("MoEFlexTokenDispatcher.dispatch_preprocess",),
        "megatron.core.transformer.torch_norm": ("L2Norm._norm",),
        "megatron.core.transformer.utils": ("erf_gelu", "gelu_impl"),
    }.items() for name in names)

# megatron-core modules that import triton at module level and whose importers have no fallback,
# with what asks for their kernels; tests/ops/test_triton_shim.py checks them against a scan
TRITON_IMPORTERS: dict[str, str] = {
    # imported by megatron/training/initialize.py
    "megatron.core.transformer.custom_layers.batch_invariant_kernels": "--batch-invariant-mode",
    # imported by megatron.core.ssm.mamba_mixer
    "megatron.core.inference.contexts.attention_context.triton.tensor_ops":
        "Mamba's dynamic-inference context (megatron.core.ssm.mamba_mixer)",
}
