"""Qwen3-MoE: qwen3's attention map; ``mlp.gate`` is the router, ``mlp.experts.{e}.*_proj`` the experts."""

from __future__ import annotations

from ..hf_config import ModelConfig
from ..llama.weights import llama_style_map
from ..moe_map import with_experts
from ..weightmap import WeightMap
from .config import TRAITS

__all__ = ["weight_map"]

_MLP = "model.layers.{i}.mlp."


def weight_map(cfg: ModelConfig) -> WeightMap:
    """Router [experts, hidden] replicated; each expert a SwiGLU MLP split over expert-TP, experts over EP."""
    return with_experts(llama_style_map(cfg, traits=TRAITS),
                        router=_MLP + "gate.weight", gate=_MLP + "experts.{e}.gate_proj.weight",
                        up=_MLP + "experts.{e}.up_proj.weight", down=_MLP + "experts.{e}.down_proj.weight")
