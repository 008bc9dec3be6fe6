"""HF Qwen2 ``config.json`` -> ModelConfig (q/k/v projections carry a bias)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hf_config import ModelConfig, hf_config_dict, load_hf_config
from ..traits import Traits

HF_MODEL_TYPES = ("qwen2",)
HF_ARCHITECTURES = ("Qwen2ForCausalLM",)
TRAITS = Traits(qk_norm=False, qkv_bias=True)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return load_hf_config(cfg, "qwen2", traits=TRAITS)


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The transformers config.json for a qwen2 model known only from Megatron args.

    Qwen2's q/k/v bias is part of the architecture, so its configs carry no attention_bias.
    """
    return hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES, attention_bias=not TRAITS.qkv_bias)
