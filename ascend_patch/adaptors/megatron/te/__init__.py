"""The Transformer-Engine-compatible layer: the part of ``transformer_engine`` megatron-core 0.16 uses.

Served as the ``transformer_engine`` shim (see :mod:`ascend_patch.ops.shims`) while the real
package is missing, so Megatron-LM's default ``--transformer-impl transformer_engine`` builds
megatron-core's own TE wrappers (``TELinear``, ``TELayerNormColumnParallelLinear``,
``TEDotProductAttention``, ``TENorm``...) on these classes:

* :mod:`.linear` - ``Linear``, ``LayerNormLinear`` on megatron's tensor-parallel functions;
* :mod:`.grouped` - ``GroupedLinear`` (MoE experts) on the grouped GEMM of :mod:`ascend_patch.ops.grouped_gemm`;
* :mod:`.norm` - ``LayerNorm``, ``RMSNorm`` (``npu_rms_norm`` on npu);
* :mod:`.attention` - ``DotProductAttention`` (``npu_fusion_attention`` on npu), with
  context parallelism from :mod:`ascend_patch.ops.context_parallel`;
* :mod:`.permutation` - MoE token permutations (``--moe-permute-fusion``; ``npu_moe_token_permute`` /
  ``npu_moe_token_unpermute`` on npu, :mod:`.permutation_npu`); :mod:`.router` - MoE routing
  and aux loss (``--moe-router-fusion``); :mod:`.cross_entropy` - the vocabulary-parallel loss
  (``--cross-entropy-fusion-impl te``);
* :mod:`.fp8` - recipes, ``fp8_autocast``, ``FP8GlobalStateManager`` (FP8 off; FP8 asked
  for is an error naming the flags); :mod:`.distributed` - the RNG tracker.

The version it claims, :data:`TE_VERSION`, decides which code paths megatron-core takes
(``is_te_min_version``); see :data:`TE_VERSION` for why this one. ``SURFACE`` lists every
shim module with the attributes it serves: adding an API is one entry there.

Nothing here imports megatron-core at import time (megatron imports ``transformer_engine``
while it is itself being imported); the layers import its tensor-parallel functions when
they run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SURFACE", "TE_VERSION", "surface"]

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

Builder = Callable[[Any], dict[str, Any]]


def _version(_catalog: Any) -> dict[str, Any]:
    return {"__version__": TE_VERSION}


def _pytorch(catalog: Any) -> dict[str, Any]:
    from . import attention, fp8, grouped, linear, norm

    bound = catalog.te_bound
    return {
        "Linear": bound(linear.Linear, "Linear", "transformer_engine.pytorch.module.linear"),
        "LayerNormLinear": bound(linear.LayerNormLinear, "LayerNormLinear",
                                 "transformer_engine.pytorch.module.layernorm_linear"),
        "LayerNorm": bound(norm.LayerNorm, "LayerNorm", "transformer_engine.pytorch.module.layernorm"),
        "RMSNorm": bound(norm.RMSNorm, "RMSNorm", "transformer_engine.pytorch.module.rmsnorm"),
        "DotProductAttention": bound(attention.DotProductAttention, "DotProductAttention",
                                     "transformer_engine.pytorch.attention.dot_product_attention"),
        "GroupedLinear": bound(grouped.GroupedLinear, "GroupedLinear",
                               "transformer_engine.pytorch.module.grouped_linear"),
        "fp8_autocast": fp8.fp8_autocast,
        "fp8_model_init": fp8.fp8_model_init,
    }


def _fp8(_catalog: Any) -> dict[str, Any]:
    from . import fp8

    queries = ("check_fp8_support", "check_mxfp8_support", "check_nvfp4_support", "check_fp8_block_scaling_support",
               "check_recipe_support")
    return {"FP8GlobalStateManager": fp8.FP8GlobalStateManager, "fp8_autocast": fp8.fp8_autocast,
            "fp8_model_init": fp8.fp8_model_init, **{name: getattr(fp8, name) for name in queries}}


def _distributed(catalog: Any) -> dict[str, Any]:
    from . import distributed

    return {"CudaRNGStatesTracker": catalog.te_bound(distributed.CudaRNGStatesTracker, "CudaRNGStatesTracker",
                                                     "transformer_engine.pytorch.distributed"),
            "activation_recompute_forward": distributed.activation_recompute_forward,
            "is_fp8_activation_recompute_enabled": distributed.is_fp8_activation_recompute_enabled,
            "in_fp8_activation_recompute_phase": distributed.in_fp8_activation_recompute_phase}


def _tensor(_catalog: Any) -> dict[str, Any]:
    from . import fp8

    return {"QuantizedTensor": fp8.QuantizedTensor, "Float8Tensor": fp8.Float8Tensor}


def _recipe(_catalog: Any) -> dict[str, Any]:
    from . import fp8

    return {name: getattr(fp8, name) for name in ("Format", "Recipe", "DelayedScaling", "Float8CurrentScaling",
                                                  "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")}


def _ops(_catalog: Any) -> dict[str, Any]:
    from . import ops_api

    return {"FusibleOperation": ops_api.FusibleOperation, "Sequential": ops_api.Sequential}


def _permutation(catalog: Any) -> dict[str, Any]:
    from . import permutation

    # permute / unpermute take the target's kernels (torch_npu's on npu); the chunk sorts need none
    return {name: catalog.bound(getattr(permutation, name)) if name in permutation.ON_TARGET
            else getattr(permutation, name) for name in permutation.__all__}


def _router(_catalog: Any) -> dict[str, Any]:
    from . import router

    return {name: getattr(router, name) for name in router.__all__}


def _cross_entropy(_catalog: Any) -> dict[str, Any]:
    from . import cross_entropy

    return {"parallel_cross_entropy": cross_entropy.parallel_cross_entropy}


def _none(_catalog: Any) -> dict[str, Any]:
    return {}


def _optimizers(catalog: Any) -> dict[str, Any]:
    return dict(catalog.te_optimizers)


# shim module -> (what it holds, builder of its attributes, submodules its import brings in).
# Parents come before children. Adding an API: one entry in the builder of its module.
SURFACE: dict[str, tuple[str, Builder, tuple[str, ...]]] = {
    "transformer_engine": ("Transformer Engine's PyTorch API on the target", _version, ("pytorch", "common")),
    "transformer_engine.common": ("transformer_engine.common.recipe", _none, ("recipe",)),
    "transformer_engine.common.recipe": ("FP8 recipes (configuration only; FP8 itself is refused)", _recipe, ()),
    "transformer_engine.pytorch": ("Linear, LayerNormLinear, GroupedLinear, LayerNorm, RMSNorm, DotProductAttention",
                                   _pytorch,
                                   ("optimizers", "fp8", "distributed", "tensor", "ops", "permutation",
                                    "router", "cross_entropy")),
    "transformer_engine.pytorch.fp8": ("FP8 state (always off), autocast, and the support queries (no)", _fp8, ()),
    "transformer_engine.pytorch.distributed": ("the RNG tracker and recompute context", _distributed, ()),
    "transformer_engine.pytorch.tensor": ("quantized tensor types (none exists here)", _tensor, ()),
    "transformer_engine.pytorch.optimizers": ("TE's fused optimizers and multi-tensor ops", _optimizers, ()),
    "transformer_engine.pytorch.permutation": ("MoE token permutations (--moe-permute-fusion)", _permutation, ()),
    "transformer_engine.pytorch.router": ("MoE top-k routing and aux loss (--moe-router-fusion)", _router, ()),
    "transformer_engine.pytorch.cross_entropy": ("the vocabulary-parallel loss (--cross-entropy-fusion-impl te)",
                                                 _cross_entropy, ()),
    "transformer_engine.pytorch.ops": ("the op-based API's names (using it is refused)", _ops, ()),
}


def surface(catalog: Any, name: str) -> dict[str, Any]:
    """The attributes of shim module ``name``, built from ``catalog`` (an ``ops.shims.ShimCatalog``)."""
    return SURFACE[name][1](catalog)
