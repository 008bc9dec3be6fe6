"""Qwen3: the llama map plus per-head q/k RMSNorm; tied embeddings in the small sizes."""

from __future__ import annotations

from ..hf_config import ModelConfig
from ..llama.weights import llama_style_map
from ..weightmap import WeightMap
from .config import TRAITS

__all__ = ["weight_map"]


def weight_map(cfg: ModelConfig) -> WeightMap:
    """q_norm / k_norm [head_dim] replicated on every TP rank; no qkv bias unless configured."""
    return llama_style_map(cfg, traits=TRAITS)
