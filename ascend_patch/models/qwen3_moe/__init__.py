"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, every MLP a router over experts."""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="qwen3_moe",
    description="Qwen3-MoE: q/k layernorm, a top-k router over SwiGLU experts, no shared expert",
    aliases=("qwen3-moe", "qwen3moe"),
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    loader_aliases=("qwen3_moe_hf",),
    traits=config.TRAITS,
    config_from_hf=config.config_from_hf,
    config_to_hf=config.config_to_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=lazy(f"{__name__}.weights", "weight_map"),
)
