"""What depends on the Megatron release, as data: the one place a megatron-core version is written."""

from __future__ import annotations

import functools
import re
import sys

__all__ = ["COMPILED_AT_IMPORT", "COMPILED_DIRECTLY", "FACTS", "MAIN", "PACKAGE", "SUPPORTED",
           "TRITON_KERNEL_USERS", "current_version", "has", "needed_on", "older", "supported", "supported_text"]

PACKAGE = "megatron-core"
SUPPORTED = ">=0.12,<0.18"  # the release lines every Megatron patch was checked against
# Megatron-LM main as tested: its package_info says the next release line (0.20.0)
MAIN = {"version": "0.20.0", "commit": "d98e8a64ddf3", "date": "2026-08-22"}

# What differs between releases, as the megatron-core releases that have it (a PEP 440 range). Patches
# name a fact (``needed_on``); other code asks ``has(fact)`` for the release the process imports.
FACTS: dict[str, str] = {
    # tensor_parallel's linear_with_grad_accumulation_and_async_allreduce(tp_group=) and the mappings'
    # reduce_from_tensor_model_parallel_region(group=) / reduce_scatter_to_sequence_parallel_region(group=)
    "tp_group_arguments": ">=0.13",
    # megatron.legacy.fused_kernels.load(), which asks nvcc for its version (0.17 stopped calling it)
    "legacy_fused_kernels": "<0.17",
    # the legacy GroupedMLP (--moe-grouped-gemm with the local spec) on the grouped_gemm package
    "legacy_grouped_mlp": "<0.17",
    # dist_checkpointing's async writer calls torch's _write_item without serialization_format (torch 2.13 needs it)
    "write_item_without_format": "<0.13",
    # dist_checkpointing calls numpy.product, which numpy 2 removed
    "numpy_product": "<0.16",
    # MockGPTLowLevelDataset takes token ids modulo the vocabulary (before: ids up to 4094 whatever it is)
    "mock_tokens_within_vocab": ">=0.16",
    # NullTokenizer adds its end-of-document id after --vocab-size ids (main's counts it among them)
    "null_tokenizer_adds_eod": "<0.18",
    # -- launch flags, as the MindSpeed-LLM migration table (ascend_patch.migrate) reads them --
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


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def supported(version: str) -> bool:
    """Whether megatron-core ``version`` is a supported release line (0.12.x-0.17.x) or the tested main."""
    have = _release(version)
    low, high = (_release(bound) for bound in re.findall(r"[\d.]+", SUPPORTED))
    return low <= have[:len(low)] and have[:len(high)] < high or have[:3] == _release(MAIN["version"])


def older(version: str) -> bool:
    """Whether megatron-core ``version`` predates the supported releases (MindSpeed-LLM 2.1.0's core_r0.8.0, say)."""
    return _release(version) < _release(re.findall(r"[\d.]+", SUPPORTED)[0])


def supported_text() -> str:
    """The supported releases, as a user reads them."""
    return f"megatron-core 0.12.x to 0.17.x, and Megatron-LM main as tested at {MAIN['commit'][:7]}, which reports " \
           f"{MAIN['version']}"


def needed_on(fact: str | None = None) -> dict[str, str]:
    """``package=`` / ``needed=`` for a Patch the releases with ``fact`` need (None: every release needs it).

    Out of the supported range the megatron plugin warns once (strict mode refuses) and applies
    every patch whose target exists, on a best-effort basis.
    """
    return {} if fact is None else {"package": PACKAGE, "needed": FACTS[fact]}


@functools.lru_cache(maxsize=8)
def _version_at(core_path: str | None) -> str | None:
    from .detect import find_megatron

    found = find_megatron()
    return None if found is None else found.version


def current_version() -> str | None:
    """The megatron-core release this process imports (None when there is none)."""
    core = sys.modules.get("megatron.core")
    if core is None:
        _version_at.cache_clear()  # not imported yet: the path may still change
        return _version_at(None)
    return _version_at(list(core.__path__)[0])


def in_release_range(version: str, spec: str) -> bool:
    """Whether ``version`` is in ``spec`` (PEP 440 on the release numbers; a local label is ignored)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(".".join(map(str, _release(version))))


def has(fact: str, version: str | None = None) -> bool:
    """Whether ``version`` (default: the release this process imports) has ``fact`` (with no megatron-core: the
    newest behaviour)."""
    version = version if version is not None else current_version()
    return in_release_range(version if version is not None else MAIN["version"], FACTS[fact])


# (module, attribute) of every function a supported megatron-core release passes through jit_fuser at
# import (a release lacking one has nothing to patch there); tests/megatron/test_mcore_patches.py checks
# the list against a scan of every vendored release.
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
        "megatron.core.fusions.fused_bias_swiglu": (
            "bias_swiglu", "bias_swiglu_back", "swiglu", "swiglu_back", "weighted_swiglu", "weighted_swiglu_back",
            "bias_clamped_swiglu", "bias_clamped_swiglu_back", "clamped_swiglu", "clamped_swiglu_back",
            "clamped_weighted_swiglu", "clamped_weighted_swiglu_back"),  # clamped: main
        "megatron.core.fusions.fused_cross_entropy": ("calculate_cross_entropy_loss", "calculate_gradients",
                                                      "calculate_logits_max", "calculate_predicted_logits"),
        "megatron.core.fusions.fused_pad_routing_map": ("fused_pad_routing_map",),
        "megatron.core.fusions.fused_weighted_squared_relu": ("_squared_relu_back", "weighted_squared_relu",
                                                              "weighted_squared_relu_back"),
        "megatron.core.ssm.gated_delta_net": ("GatedDeltaNet._apply_gated_norm",),  # main: a package, below
        "megatron.core.ssm.gated_delta_net.common": ("_GDNBase._apply_gated_norm",
                                                     "_GDNBase._prepare_input_for_gated_delta_rule"),
        "megatron.core.ssm.gated_delta_net.gdn": ("GatedDeltaNet._compute_gates",),
        "megatron.core.ssm.gated_delta_net.gdn2": ("GatedDeltaNet2._compute_gates",),
        "megatron.core.transformer.attention": ("Attention._apply_output_gate",),
        "megatron.core.transformer.moe.router": ("TopKRouter._apply_expert_bias",),
        "megatron.core.transformer.moe.token_dispatcher": ("MoEFlexTokenDispatcher.dispatch_preprocess",),
        "megatron.core.transformer.torch_norm": ("L2Norm._norm",),
        "megatron.core.transformer.utils": ("erf_gelu", "gelu_impl"),
    }.items() for name in names)

# methods decorated with torch.compile itself at import (main's hyper-connections; 0.17.1's and main's
# InferenceTopKRouter._compiled_topk_routing is inference-only and a staticmethod, left alone)
COMPILED_DIRECTLY: tuple[tuple[str, str], ...] = tuple(
    ("megatron.core.transformer.hyper_connection", f"HyperConnectionModule.{name}")
    for name in ("_projection_and_get_norm", "_compute_h", "_apply_h_post", "aggregate", "apply_h_res"))

# What asks for the kernels of megatron-core modules that import triton (module, or package, -> the flag or
# feature), named when such a kernel is launched without triton. Which importers get the triton shim is not
# listed: a rule decides (triton_shim.served_importer).
TRITON_KERNEL_USERS: dict[str, str] = {
    "megatron.core.transformer.custom_layers.batch_invariant_kernels": "--batch-invariant-mode",
    "megatron.core.transformer.moe.ops.paged_stash": "--moe-paged-stash",
    "megatron.core.ssm": "Mamba layers (hybrid models)",
    "megatron.core.inference": "dynamic inference",
}
