"""Qwen2 / Qwen2.5: the llama layout plus a bias on the q/k/v projections."""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="qwen2",
    description="Qwen2 / Qwen2.5: llama layout with q/k/v bias",
    aliases=("qwen2.5", "qwen"),
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    loader_aliases=("qwen_hf", "qwen2_hf", "qwen2.5_hf"),
    traits=config.TRAITS,
    config_from_hf=config.config_from_hf,
    config_to_hf=config.config_to_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=lazy(f"{__name__}.weights", "weight_map"),
)
