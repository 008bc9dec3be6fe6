"""The megatron-core layer spec for mixtral: llama's attention, a router and SequentialMLP experts."""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.spec_utils import ModuleSpec

from ..layer_spec import moe_layer_spec

__all__ = ["layer_spec"]


def layer_spec(model_config: Any = None) -> ModuleSpec:
    """The mixtral decoder layer (``model_config`` gives the expert count)."""
    return moe_layer_spec(model_config, normalization="RMSNorm", qk_layernorm=False)
