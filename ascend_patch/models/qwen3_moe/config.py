"""HF Qwen3-MoE ``config.json`` -> ModelConfig (Qwen3 attention plus the router and experts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..hf_config import ConfigMismatch, ModelConfig, hf_config_dict, load_hf_config
from ..traits import Traits

HF_MODEL_TYPES = ("qwen3_moe",)
HF_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
TRAITS = Traits(qk_norm=True, qkv_bias=None, moe=True)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """Every layer must be sparse: megatron-core's GPT layer spec gives all layers one MLP kind."""
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if not experts:
        raise ConfigMismatch("config.json for a qwen3_moe model gives no num_experts")
    dense = list(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    if dense or step != 1:
        raise ConfigMismatch(f"qwen3_moe with dense layers (mlp_only_layers={dense}, decoder_sparse_step={step}) is "
                             "not supported: the converter's layer spec makes every layer an MoE layer; Qwen3-MoE "
                             "releases use mlp_only_layers=[] and decoder_sparse_step=1")
    base = load_hf_config(cfg, "qwen3_moe", traits=TRAITS)
    return dataclasses.replace(
        base, num_experts=int(experts),
        moe_ffn_hidden_size=int(cfg.get("moe_intermediate_size") or base.ffn_hidden_size),
        moe_router_topk=int(cfg.get("num_experts_per_tok", 8)),
        # norm_topk_prob: renormalised top-k == megatron's default (top-k, then softmax over those);
        # without it the probabilities stay those of the softmax over all experts
        moe_router_pre_softmax=not bool(cfg.get("norm_topk_prob", True)),
        moe_aux_loss_coeff=float(cfg.get("router_aux_loss_coef", 0.001)))


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The transformers config.json for a qwen3_moe model known only from Megatron args."""
    out = hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES)
    out.update(num_experts=cfg.num_experts, moe_intermediate_size=cfg.moe_ffn_hidden_size,
               num_experts_per_tok=cfg.moe_router_topk, norm_topk_prob=not cfg.moe_router_pre_softmax,
               router_aux_loss_coef=cfg.moe_aux_loss_coeff, decoder_sparse_step=1, mlp_only_layers=[])
    return out
