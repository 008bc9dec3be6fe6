"""The megatron-core layer spec for llama. Llama / Mistral: RMSNorm, GQA, SwiGLU (the MLP's gating comes from TransformerConfig.gated_linear_unit)."""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.spec_utils import ModuleSpec

from ..layer_spec import traits_layer_spec
from .config import TRAITS

__all__ = ["layer_spec"]


def layer_spec(model_config: Any = None) -> ModuleSpec:
    """The llama decoder layer (context-parallel attention; see ascend_patch.models.layer_spec)."""
    return traits_layer_spec(TRAITS, model_config)
