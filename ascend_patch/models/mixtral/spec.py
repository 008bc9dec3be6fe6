"""The megatron-core layer spec for mixtral: llama's attention, a router and SequentialMLP experts."""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.spec_utils import ModuleSpec

from ..layer_spec import traits_layer_spec
from .config import TRAITS

__all__ = ["layer_spec"]


def layer_spec(model_config: Any = None) -> ModuleSpec:
    """The mixtral decoder layer (``model_config`` gives the expert count)."""
    return traits_layer_spec(TRAITS, model_config)
