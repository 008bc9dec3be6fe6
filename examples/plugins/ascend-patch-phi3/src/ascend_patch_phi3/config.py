"""Phi-3 ``config.json`` -> ascend_patch's ModelConfig, refusing what the llama layer cannot hold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ascend_patch.models.hf_config import ConfigMismatch, ModelConfig, load_hf_config

__all__ = ["HF_MODEL_TYPES", "HF_ARCHITECTURES", "config_from_hf"]

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
