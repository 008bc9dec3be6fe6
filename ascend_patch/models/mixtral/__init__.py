"""Mixtral (8x7B, 8x22B): Mistral's attention, every MLP a top-2 router over eight experts."""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="mixtral",
    description="Mixtral: GQA, a top-k router over SwiGLU experts (block_sparse_moe)",
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    loader_aliases=("mixtral_hf",),
    traits=config.TRAITS,
    config_from_hf=config.config_from_hf,
    config_to_hf=config.config_to_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=lazy(f"{__name__}.weights", "weight_map"),
)
