"""HF Qwen3 ``config.json`` -> ModelConfig (q/k layernorm, explicit head_dim)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hf_config import ModelConfig, hf_config_dict, load_hf_config
from ..traits import Traits

HF_MODEL_TYPES = ("qwen3",)
HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
TRAITS = Traits(qk_norm=True, qkv_bias=None, tied=True)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return load_hf_config(cfg, "qwen3", traits=TRAITS)


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The transformers config.json for a qwen3 model known only from Megatron args."""
    return hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES)
