"""Llama (and Mistral-style llama variants): GQA, RMSNorm, SwiGLU, RoPE, untied embeddings."""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="llama",
    description="Llama and Mistral-style llama variants: GQA, RMSNorm, SwiGLU, RoPE",
    aliases=("mistral", "llama2", "llama3", "llama3.1", "llama3.2"),
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    # MindSpeed-LLM's and Megatron-LM's names for the HF loader when it reads these models
    loader_aliases=("llama_hf", "llama2_hf", "llama3_hf", "mistral_hf", "llama_mistral"),
    traits=config.TRAITS,
    config_from_hf=config.config_from_hf,
    config_to_hf=config.config_to_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=lazy(f"{__name__}.weights", "weight_map"),
)
