"""``ModelConfig`` (from an HF ``config.json``) -> megatron-core ``TransformerConfig`` and ``GPTModel`` arguments."""

from __future__ import annotations

from typing import Any

from ..dtypes import SHORT_NAMES
from .hf_config import ConfigMismatch, ModelConfig, rope_scaling_kwargs
from .vocab import padded_vocab_size

__all__ = ["transformer_config_kwargs", "transformer_config", "gpt_model_kwargs", "rope_scaling_kwargs"]



def transformer_config_kwargs(mc: ModelConfig, dtype: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The ``TransformerConfig`` keyword arguments for ``mc`` (``dtype`` fp32/bf16/fp16 overrides the
    checkpoint's); ``overrides`` (parallel sizes, fusions, ...) are passed through and win.

    Warns with :attr:`ModelConfig.notes` (e.g. a sliding window the model will not apply).
    """
    import warnings

    import torch
    import torch.nn.functional as F

    for note in mc.notes:
        warnings.warn(note, UserWarning, stacklevel=2)

    dtype = dtype or mc.params_dtype
    if dtype not in SHORT_NAMES:
        raise ConfigMismatch(f"dtype {dtype!r} is not a training dtype", "dtype", f"use one of {', '.join(SHORT_NAMES)}")
    params_dtype = getattr(torch, SHORT_NAMES[dtype])
    kwargs: dict[str, Any] = dict(
        num_layers=mc.num_layers,
        hidden_size=mc.hidden_size,
        ffn_hidden_size=mc.ffn_hidden_size,
        num_attention_heads=mc.num_attention_heads,
        num_query_groups=mc.num_query_groups,
        kv_channels=mc.kv_channels,
        normalization=mc.normalization,
        layernorm_epsilon=mc.norm_epsilon,
        add_bias_linear=mc.add_bias_linear,
        add_qkv_bias=mc.add_qkv_bias,
        qk_layernorm=mc.qk_layernorm,
        gated_linear_unit=mc.activation == "swiglu",
        activation_func=F.silu if mc.activation == "swiglu" else F.gelu,
        hidden_dropout=mc.hidden_dropout,
        attention_dropout=mc.attention_dropout,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
    )
    if mc.is_moe:
        kwargs.update(
            num_moe_experts=mc.num_experts,
            moe_ffn_hidden_size=mc.moe_ffn_hidden_size or mc.ffn_hidden_size,
            moe_router_topk=mc.moe_router_topk,
            moe_router_pre_softmax=mc.moe_router_pre_softmax,
            moe_router_load_balancing_type="aux_loss" if mc.moe_aux_loss_coeff else "none",
            moe_aux_loss_coeff=mc.moe_aux_loss_coeff,
        )
    kwargs.update(overrides)
    return kwargs


# The same facts :meth:`ModelConfig.megatron_args` prints as Megatron-LM flags, in the
# form megatron-core's Python API takes, so a program can build the model directly::
#
#     config = transformer_config(model_config, tensor_model_parallel_size=2, sequence_parallel=True)
#     model = GPTModel(config, spec.layer_spec(model_config), **gpt_model_kwargs(model_config, 2))
#
# megatron-core is imported only when :func:`transformer_config` is called.
def transformer_config(mc: ModelConfig, dtype: str | None = None, **overrides: Any) -> Any:
    """A megatron-core ``TransformerConfig`` for ``mc`` (see :func:`transformer_config_kwargs`)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs(mc, dtype, **overrides))


def gpt_model_kwargs(mc: ModelConfig, tensor_parallel_size: int = 1,
                     make_vocab_size_divisible_by: int = 128) -> dict[str, Any]:
    """``GPTModel`` keyword arguments besides the config and layer spec (vocab padded for TP)."""
    kwargs: dict[str, Any] = dict(
        vocab_size=padded_vocab_size(mc.vocab_size, make_vocab_size_divisible_by, tensor_parallel_size),
        max_sequence_length=mc.max_position_embeddings,
        share_embeddings_and_output_weights=mc.tie_word_embeddings,
        position_embedding_type=mc.position_embedding_type,
    )
    if mc.position_embedding_type == "rope":
        base = mc.rotary_base
        kwargs["rotary_base"] = int(base) if float(base).is_integer() else base
        kwargs["rotary_percent"] = 1.0
        kwargs.update(rope_scaling_kwargs(mc.rope_scaling))
    return kwargs
