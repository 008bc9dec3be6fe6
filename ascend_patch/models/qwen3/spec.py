"""The megatron-core layer spec for qwen3. Qwen3: the llama layer with RMSNorm on queries and keys (per head)."""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.spec_utils import ModuleSpec

from ..layer_spec import traits_layer_spec
from .config import TRAITS

__all__ = ["layer_spec"]


def layer_spec(model_config: Any = None) -> ModuleSpec:
    """The qwen3 decoder layer (context-parallel attention; see ascend_patch.models.layer_spec)."""
    return traits_layer_spec(TRAITS, model_config)
