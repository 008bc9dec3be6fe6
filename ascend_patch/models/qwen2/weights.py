"""Qwen2 / Qwen2.5: the llama map plus a bias on the q/k/v projections."""

from __future__ import annotations

from ..hf_config import ModelConfig
from ..llama.weights import llama_style_map
from ..weightmap import WeightMap
from .config import TRAITS

__all__ = ["weight_map"]


def weight_map(cfg: ModelConfig) -> WeightMap:
    """q/k/v bias interleaved per query group like the weights; no q/k norm."""
    return llama_style_map(cfg, traits=TRAITS)
