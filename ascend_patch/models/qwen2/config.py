"""HF Qwen2 ``config.json`` -> ModelConfig (q/k/v projections carry a bias)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hf_config import ModelConfig, load_hf_config

HF_MODEL_TYPES = ("qwen2",)
HF_ARCHITECTURES = ("Qwen2ForCausalLM",)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return load_hf_config(cfg, "qwen2", qk_layernorm=False, add_qkv_bias=True, default_tied=False)
