"""The Transformer-Engine-compatible layer: the part of ``transformer_engine`` megatron-core 0.16 uses, on the target.

:data:`SURFACE` is its shim table (served by :mod:`.shims` while TE is missing; megatron-core
builds its own TE wrappers on these classes). Nothing here imports megatron-core at import time.
"""

from __future__ import annotations

from ....shim import Renamed, ShimSpec, ShimTable

__all__ = ["OPS_ACTIVATIONS", "OPS_OPERATIONS", "SURFACE", "TE_VERSION"]

# The Transformer Engine API level this layer implements and reports as transformer_engine.__version__
# (megatron-core reads __version__ before any distribution metadata; the shim has none, so
# importlib.metadata.version("transformer-engine") still says it is not installed). Why 2.7.0:
# * >= 1.12: megatron passes cp_comm_type (1.10) and the hierarchical a2a+p2p groups (1.12);
# * >= 2.0: TE 2.x's empty-tensor _extra_state, which the checkpoints of current TE installs carry;
#   megatron's fp8_utils then imports transformer_engine.pytorch.tensor.QuantizedTensor (provided);
# * >= 2.3: megatron hands delay_wgrad_compute / symmetric_ar_type to the layers, which refuse them
#   with their flag's name (below 2.3 megatron refuses them itself, blaming the TE version);
# * >= 2.7: megatron-core imports the fused MoE router (transformer_engine.pytorch.router, provided)
#   and calls parallel_cross_entropy with its seven arguments; what else 2.7 changes in megatron-core
#   0.16 is FP4 and CUDA-graph code, which the targets refuse or never reach.
# * not higher: megatron-core's checks at 2.8 and above switch on paths this layer was not checked against.
TE_VERSION = "2.7.0"

# Every name of transformer_engine.pytorch.ops a supported megatron-core release reads (tests/ops/test_ops_te_layer.py
# checks them against the vendored releases): 0.13/0.14's TEFusedMLP names the fused activations in its class
# body, so they must exist when megatron.core.extensions.transformer_engine is imported; 0.15+ read SiLU,
# BasicLinear, Bias, AllReduce, ReduceScatter, MakeExtraOutput; main the Scaled* activations and GroupedLinear.
OPS_ACTIVATIONS = ("GELU", "GEGLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU", "SwiGLU",
                   "ScaledSwiGLU", "ScaledSReLU", "ScaledClampedQGeGLU")
OPS_OPERATIONS = ("Linear", "BasicLinear", "Bias", "LayerNorm", "RMSNorm", "GroupedLinear", "AllGather",
                  "AllReduce", "ReduceScatter", "MakeExtraOutput")

_TE = "ascend_patch.adaptors.megatron.te"
_OPS = "ascend_patch.ops"
_HINTS = {
    "ops": "TE's operation-based API is not provided; drop --use-te-activation-func and "
           "--use-transformer-engine-op-fuser",
    "module": "TE's userbuffers (--tp-comm-overlap) are not available on this target; drop --tp-comm-overlap",
    "attention": "TE's fused RoPE / packed-QKV helpers are not provided; megatron-core falls back to its own",
    "*": "ascend_patch's transformer_engine layer provides transformer_engine.pytorch.Linear, LayerNormLinear, "
         "GroupedLinear, LayerNorm, RMSNorm, DotProductAttention, fp8_autocast (FP8 off), .optimizers, "
         ".distributed's RNG tracker, .permutation (--moe-permute-fusion), .router (--moe-router-fusion), "
         ".cross_entropy "
         "(--cross-entropy-fusion-impl te) and transformer_engine.common.recipe; see docs/megatron.md for the "
         "coverage table",
}
_OPTIMIZER_HINTS = {
    "multi_tensor_adam_fp8": "fp8 optimizer states are not supported; use multi_tensor_adam",
    "multi_tensor_adam_capturable": "CUDA-graph capture is not available; use multi_tensor_adam",
    "multi_tensor_adam_capturable_master": "CUDA-graph capture is not available; use multi_tensor_adam",
    "multi_tensor_unscale_l2norm": "call multi_tensor_scale with 1/scale, then multi_tensor_l2norm",
    "multi_tensor_scale_tensor": "use multi_tensor_scale with a Python float",
    "*": "the shim provides FusedAdam, FusedSGD, multi_tensor_applier, multi_tensor_scale, multi_tensor_l2norm, "
         "multi_tensor_adam and multi_tensor_sgd",
}
_FP8 = {name: f"{_TE}.fp8:{name}" for name in ("fp8_autocast", "fp8_model_init")}
_MODULES = "transformer_engine.pytorch.module"


def _layer(path: str, module: str) -> Renamed:
    # TE's classes under TE's names and modules: megatron-core subclasses them (TELinear, TENorm, ...)
    return Renamed(f"{_TE}.{path}", module)


# Adding an API: one name in the module that serves it.
SURFACE: ShimTable = {
    "transformer_engine": ShimSpec("Transformer Engine's PyTorch API on the target", children=("pytorch", "common"),
                                   version=TE_VERSION, hints=_HINTS),
    "transformer_engine.common": ShimSpec("transformer_engine.common.recipe", children=("recipe",), hints=_HINTS),
    "transformer_engine.common.recipe": ShimSpec(
        "FP8 recipes (configuration only; FP8 itself is refused)",
        {name: f"{_TE}.fp8:{name}" for name in ("Format", "Recipe", "DelayedScaling", "Float8CurrentScaling",
                                                "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")},
        hints=_HINTS),
    "transformer_engine.pytorch": ShimSpec(
        "Linear, LayerNormLinear, GroupedLinear, LayerNorm, RMSNorm, DotProductAttention",
        {"Linear": _layer("linear:Linear", f"{_MODULES}.linear"),
         "LayerNormLinear": _layer("linear:LayerNormLinear", f"{_MODULES}.layernorm_linear"),
         "LayerNorm": _layer("norm:LayerNorm", f"{_MODULES}.layernorm"),
         "RMSNorm": _layer("norm:RMSNorm", f"{_MODULES}.rmsnorm"),
         "DotProductAttention": _layer("attention:DotProductAttention",
                                       "transformer_engine.pytorch.attention.dot_product_attention"),
         "GroupedLinear": _layer("grouped:GroupedLinear", f"{_MODULES}.grouped_linear"),
         **_FP8},
        children=("optimizers", "fp8", "distributed", "tensor", "ops", "permutation", "router", "cross_entropy"),
        hints=_HINTS),
    "transformer_engine.pytorch.fp8": ShimSpec(
        "FP8 state (always off), autocast, and the support queries (no, and why)",
        {"FP8GlobalStateManager": f"{_TE}.fp8:FP8GlobalStateManager", **_FP8,
         **{name: f"{_TE}.fp8:{name}" for name in (
             "check_fp8_support", "check_mxfp8_support", "check_nvfp4_support", "check_fp8_block_scaling_support",
             "check_recipe_support")}},
        hints=_HINTS),
    "transformer_engine.pytorch.distributed": ShimSpec(
        "the RNG tracker and recompute context",
        {"CudaRNGStatesTracker": _layer("distributed:CudaRNGStatesTracker", "transformer_engine.pytorch.distributed"),
         **{name: f"{_TE}.distributed:{name}" for name in (
             "activation_recompute_forward", "is_fp8_activation_recompute_enabled",
             "in_fp8_activation_recompute_phase")}},
        hints=_HINTS),
    "transformer_engine.pytorch.tensor": ShimSpec(
        "quantized tensor types (none exists here)",
        {name: f"{_TE}.fp8:{name}" for name in ("QuantizedTensor", "Float8Tensor")}, hints=_HINTS),
    "transformer_engine.pytorch.optimizers": ShimSpec(
        "TE's fused optimizers and multi-tensor ops",
        {"FusedAdam": Renamed(f"{_OPS}.optim:TEFusedAdam", "transformer_engine.pytorch.optimizers.fused_adam"),
         "FusedSGD": Renamed(f"{_OPS}.optim:TEFusedSGD", "transformer_engine.pytorch.optimizers.fused_sgd"),
         "MultiTensorApply": f"{_OPS}.multi_tensor:TEMultiTensorApply",
         "multi_tensor_applier": f"{_OPS}.multi_tensor:te_multi_tensor_applier",
         # the same multi-tensor ops as amp_C's
         **{name: f"{_OPS}.multi_tensor:{name}" for name in (
             "multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_adam", "multi_tensor_sgd")}},
        hints=_OPTIMIZER_HINTS),
    "transformer_engine.pytorch.permutation": ShimSpec(
        "MoE token permutations (--moe-permute-fusion)",
        {name: f"{_TE}.permutation:{name}" for name in (
            "moe_permute", "moe_permute_with_probs", "moe_unpermute", "moe_sort_chunks_by_index",
            "moe_sort_chunks_by_index_with_probs")},
        hints=_HINTS),
    "transformer_engine.pytorch.router": ShimSpec(
        "MoE top-k routing and aux loss (--moe-router-fusion)",
        {name: f"{_TE}.router:{name}" for name in (
            "fused_topk_with_score_function", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss")},
        hints=_HINTS),
    "transformer_engine.pytorch.cross_entropy": ShimSpec(
        "the vocabulary-parallel loss (--cross-entropy-fusion-impl te)",
        {"parallel_cross_entropy": f"{_TE}.cross_entropy:parallel_cross_entropy"}, hints=_HINTS),
    "transformer_engine.pytorch.ops": ShimSpec(
        "the op-based API's names (using it is refused)",
        {name: f"{_TE}.ops_api:{name}" for name in ("FusibleOperation", "Sequential", *OPS_ACTIVATIONS,
                                                     *OPS_OPERATIONS)},
        hints={"*": _HINTS["ops"]}),
}
