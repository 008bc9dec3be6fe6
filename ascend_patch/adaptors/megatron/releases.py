"""What depends on the Megatron release, as data: the one place a megatron-core version is written."""

from __future__ import annotations

import re

__all__ = ["COMPILED_AT_IMPORT", "FACTS", "MAIN", "PACKAGE", "SUPPORTED", "TRITON_IMPORTERS", "needed_on", "supported",
           "supported_text"]

PACKAGE = "megatron-core"
SUPPORTED = ">=0.12,<0.18"  # the release lines every Megatron patch was checked against
# Megatron-LM main as tested: its package_info says the next release line (0.20.0)
MAIN = {"version": "0.20.0", "commit": "d98e8a64ddf3", "date": "2026-08-22"}


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def supported(version: str) -> bool:
    """Whether megatron-core ``version`` is a supported release line (0.12.x-0.17.x) or the tested main."""
    have = _release(version)
    low, high = (_release(bound) for bound in re.findall(r"[\d.]+", SUPPORTED))
    return low <= have[:len(low)] and have[:len(high)] < high or have[:3] == _release(MAIN["version"])


def supported_text() -> str:
    """The supported releases, as a user reads them."""
    return f"megatron-core 0.12.x to 0.17.x, and Megatron-LM main as tested at {MAIN['commit'][:7]}, which reports " \
           f"{MAIN['version']}"


# what differs between releases, as the PEP 440 range of megatron-core releases that have it
FACTS: dict[str, str] = {}


def needed_on(fact: str | None = None) -> dict[str, str]:
    """``package=`` / ``needed=`` for a Patch the releases with ``fact`` need (None: every release needs it).

    Out of the supported range the megatron plugin warns once (strict mode refuses) and applies
    every patch whose target exists, on a best-effort basis.
    """
    return {} if fact is None else {"package": PACKAGE, "needed": FACTS[fact]}


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
