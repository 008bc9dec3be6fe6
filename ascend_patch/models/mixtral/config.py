"""HF Mixtral ``config.json`` -> ModelConfig (Mistral attention plus the router and experts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..hf_config import ConfigMismatch, ModelConfig, hf_config_dict, load_hf_config
from ..traits import Traits

HF_MODEL_TYPES = ("mixtral",)
HF_ARCHITECTURES = ("MixtralForCausalLM",)
TRAITS = Traits(qk_norm=False, qkv_bias=False, moe=True)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """Mixtral's experts are ``intermediate_size`` wide; its router renormalises the top-k probabilities,
    which is megatron-core's default (top-k on the logits, then a softmax over those)."""
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if not experts:
        raise ConfigMismatch("config.json for a mixtral model gives no num_local_experts")
    base = load_hf_config(cfg, "mixtral", traits=TRAITS)
    return dataclasses.replace(base, num_experts=int(experts), moe_ffn_hidden_size=base.ffn_hidden_size,
                               moe_router_topk=int(cfg.get("num_experts_per_tok", 2)),
                               moe_aux_loss_coeff=float(cfg.get("router_aux_loss_coef", 0.02)))


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The transformers config.json for a mixtral model known only from Megatron args."""
    out = hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES)
    out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.moe_router_topk,
               router_aux_loss_coef=cfg.moe_aux_loss_coeff, intermediate_size=cfg.moe_ffn_hidden_size)
    return out
