"""Phi-3 ``config.json`` -> ascend_patch's ModelConfig, refusing what the llama layer cannot hold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ascend_patch.models.hf_config import ConfigMismatch, ModelConfig, hf_config_dict, load_hf_config

__all__ = ["HF_MODEL_TYPES", "HF_ARCHITECTURES", "config_from_hf", "config_to_hf"]

HF_MODEL_TYPES = ("phi3",)
HF_ARCHITECTURES = ("Phi3ForCausalLM",)


def _partial_rotary(cfg: Mapping[str, Any]) -> float:
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    return float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """Phi-3 is llama-shaped: GQA, RMSNorm, SwiGLU, rotate-half RoPE, no biases, untied embeddings."""
    factor = _partial_rotary(cfg)
    if factor != 1.0:
        raise ConfigMismatch(f"phi3 with partial_rotary_factor={factor} rotates only part of each head; "
                             "the llama layer rotates all of it (only 1.0 is supported)")
    out = load_hf_config(cfg, "phi3", qk_layernorm=False, add_qkv_bias=False, default_tied=False)
    if out.rope_scaling is not None:
        kind = out.rope_scaling.get("rope_type", out.rope_scaling.get("type"))
        raise ConfigMismatch(f"phi3 with {kind!r} rope scaling (the 128k-context models) is not supported by "
                             "this example plugin; the 4k-context configs are")
    return out


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """A Phi-3 config.json for a model known only from Megatron args (a checkpoint Megatron-LM wrote)."""
    out = hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES, attention_bias=False)
    out["partial_rotary_factor"] = 1.0  # what config_from_hf accepts: the whole head rotates
    # Megatron's args keep no special tokens: Phi-3's own, where the vocabulary holds them
    for key, token in (("bos_token_id", 1), ("eos_token_id", 32000), ("pad_token_id", 32000)):
        out[key] = token if token < cfg.vocab_size else None
    return out
