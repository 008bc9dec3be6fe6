"""The megatron-core layer spec the built-in families share: a dense pre-norm decoder layer (imports megatron-core)."""

from __future__ import annotations

from typing import Any

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from .attention import ContextParallelAttention
from .hf_config import ConfigMismatch

__all__ = ["dense_layer_spec", "family_layer_spec", "local_spec_provider", "moe_layer_spec", "traits_layer_spec"]

# Built from megatron-core's own modules (``TransformerLayer``, ``SelfAttention``,
# ``ColumnParallelLinear``/``RowParallelLinear``, ``MLP``, the local norm) with one change:
# the core attention is :class:`ascend_patch.models.attention.ContextParallelAttention`,
# so the specs train with context parallelism without Transformer Engine. Importing this
# module imports megatron-core; the family plugins import it only when a spec is built.
_NORMS = ("LayerNorm", "RMSNorm")


class _LocalPieces:
    """megatron-core's local modules, chosen as its ``LocalSpecProvider`` (0.13+) chooses them, for 0.12."""

    def column_parallel_linear(self) -> type:
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear

        return ColumnParallelLinear

    def row_parallel_linear(self) -> type:
        from megatron.core.tensor_parallel.layers import RowParallelLinear

        return RowParallelLinear

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        if rms_norm:
            return WrappedTorchNorm
        try:
            import apex  # noqa: F401  (megatron-core's own test for its fused norm)

            from megatron.core.fusions.fused_layer_norm import FusedLayerNorm
        except ImportError:
            return WrappedTorchNorm
        return FusedLayerNorm


def local_spec_provider() -> Any:
    """megatron-core's ``LocalSpecProvider`` (0.13 and later), or the same choices where it has none (0.12)."""
    try:
        from megatron.core.models.backends import LocalSpecProvider
    except ImportError:
        return _LocalPieces()
    return LocalSpecProvider()


def dense_layer_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False) -> ModuleSpec:
    """A decoder layer: norm -> self-attention (q/k norm optional) -> norm -> MLP, with residuals."""
    if normalization not in _NORMS:
        raise ConfigMismatch(f"normalization={normalization!r} is not supported", "normalization",
                             f"use one of {', '.join(_NORMS)} (--normalization)")
    provider = local_spec_provider()
    rms = normalization == "RMSNorm"
    norm = provider.layer_norm(rms_norm=rms, for_qk=False)
    qk_norm = provider.layer_norm(rms_norm=rms, for_qk=True) if qk_layernorm else IdentityOp
    attention = ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=provider.column_parallel_linear(),
            core_attention=ContextParallelAttention,
            linear_proj=provider.row_parallel_linear(),
            q_layernorm=qk_norm,
            k_layernorm=qk_norm,
        ),
    )
    mlp = ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=provider.column_parallel_linear(),
                                                          linear_fc2=provider.row_parallel_linear()))
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=attention,
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
            # the names TE-spec checkpoints use for these norms, as megatron-core's local spec maps them
            sharded_state_dict_keys_map={
                "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
            },
        ),
    )


def family_layer_spec(config: Any, normalization: str, qk_layernorm: bool) -> ModuleSpec:
    """The layer spec of a family whose defaults are ``normalization`` / ``qk_layernorm``.

    ``config`` is an :class:`ascend_patch.models.hf_config.ModelConfig`, a megatron-core
    ``TransformerConfig`` or None; its ``normalization`` wins over the family default, and
    q/k norm is on when the family or the config asks for it.
    """
    if config is not None:
        normalization = getattr(config, "normalization", None) or normalization
        qk_layernorm = qk_layernorm or bool(getattr(config, "qk_layernorm", False))
    return dense_layer_spec(normalization=normalization, qk_layernorm=qk_layernorm)


def moe_layer_spec(config: Any, normalization: str, qk_layernorm: bool, num_experts: int | None = None,
                   grouped_gemm: bool = False) -> ModuleSpec:
    """The family's decoder layer with a mixture-of-experts MLP: megatron-core's router and
    ``SequentialMLP`` experts (``grouped_gemm``: its legacy ``GroupedMLP``) built from local layers.

    ``num_experts`` defaults to the config's (``ModelConfig.num_experts``, Megatron-LM's
    ``args.num_experts`` or a ``TransformerConfig``'s ``num_moe_experts``); the config's
    ``moe_grouped_gemm`` asks for GroupedMLP too.
    """
    import dataclasses
    import inspect

    from megatron.core.models.gpt import moe_module_specs

    layer = family_layer_spec(config, normalization, qk_layernorm)
    experts = num_experts or getattr(config, "num_experts", None) or getattr(config, "num_moe_experts", None)
    grouped = grouped_gemm or bool(getattr(config, "moe_grouped_gemm", False))  # Megatron-LM's --moe-grouped-gemm
    if not experts:
        raise ConfigMismatch("an MoE layer spec needs the number of experts", "num-experts",
                             "give --num-experts (the config's num_experts)")
    # the function and its arguments as the imported megatron-core has them: 0.12 has no backend form, 0.17
    # dropped the legacy GroupedMLP (its local grouped GEMM is SequentialMLP)
    build = getattr(moe_module_specs, "get_moe_module_spec_for_backend", None)
    kwargs: dict[str, Any] = {"num_experts": int(experts), "moe_grouped_gemm": grouped}
    if build is None:
        build, kwargs["use_te"] = moe_module_specs.get_moe_module_spec, False
    else:
        kwargs["backend"] = local_spec_provider()
    if "moe_use_legacy_grouped_gemm" in inspect.signature(build).parameters:
        kwargs["moe_use_legacy_grouped_gemm"] = grouped
    mlp = build(**kwargs)
    layer.submodules = dataclasses.replace(layer.submodules, mlp=mlp, sharded_state_dict_keys_map={
        "input_layernorm.": "self_attention.linear_qkv.layer_norm_"})
    return layer


def traits_layer_spec(traits: Any, config: Any) -> ModuleSpec:
    """The layer spec a family's :class:`~.registry.Traits` describe: dense or MoE, its norm, q/k norm."""
    build = moe_layer_spec if traits.moe else family_layer_spec
    return build(config, traits.normalization, bool(traits.qk_norm))
