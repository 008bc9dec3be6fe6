"""Mixtral: the llama attention map; ``block_sparse_moe.gate`` is the router, ``experts.{e}.w1/w3/w2`` gate/up/down."""

from __future__ import annotations

from ..hf_config import ModelConfig
from ..llama.weights import llama_style_map
from ..moe_map import with_experts
from ..weightmap import WeightMap
from .config import TRAITS

__all__ = ["weight_map"]

_MOE = "model.layers.{i}.block_sparse_moe."


def weight_map(cfg: ModelConfig) -> WeightMap:
    """Router [experts, hidden] replicated; each expert a SwiGLU MLP split over expert-TP, experts over EP."""
    return with_experts(llama_style_map(cfg, traits=TRAITS), router=_MOE + "gate.weight", gate=_MOE + "experts.{e}.w1.weight",
                        up=_MOE + "experts.{e}.w3.weight", down=_MOE + "experts.{e}.w2.weight")
