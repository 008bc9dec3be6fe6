"""HF Llama / Mistral ``config.json`` -> ModelConfig."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hf_config import ModelConfig, hf_config_dict, load_hf_config
from ..traits import Traits

HF_MODEL_TYPES = ("llama", "mistral")
HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
TRAITS = Traits(qk_norm=False, qkv_bias=False)  # an attention_bias config also has an o_proj bias: refused


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return load_hf_config(cfg, "llama", traits=TRAITS)


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The transformers config.json for a llama model known only from Megatron args."""
    return hf_config_dict(cfg, dtype, HF_MODEL_TYPES, HF_ARCHITECTURES)
