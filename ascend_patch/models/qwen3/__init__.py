"""Qwen3: q/k RMSNorm per head, an explicit head_dim, tied embeddings in the small sizes."""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="qwen3",
    description="Qwen3: q/k layernorm, explicit head_dim, tied embeddings",
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    loader_aliases=("qwen3_hf",),
    traits=config.TRAITS,
    config_from_hf=config.config_from_hf,
    config_to_hf=config.config_to_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=lazy(f"{__name__}.weights", "weight_map"),
)
