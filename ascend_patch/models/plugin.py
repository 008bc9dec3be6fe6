"""The built-in model-family plugin: gpt, llama (and mistral), qwen2, qwen3."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..hookspec import hookimpl
from .registry import ModelSpec

__all__ = ["ascend_patch_model_specs", "builtin_specs"]

_FAMILIES = {
    "gpt": ("Megatron's classic GPT: LayerNorm, GeLU, learned absolute positions", ()),
    "llama": ("Llama and Mistral-style llama variants: GQA, RMSNorm, SwiGLU, RoPE", ("mistral",)),
    "qwen2": ("Qwen2 / Qwen2.5: llama layout with q/k/v bias", ("qwen2.5",)),
    "qwen3": ("Qwen3: q/k layernorm, explicit head_dim, tied embeddings", ()),
}


def _lazy(module: str, attr: str) -> Callable[..., Any]:
    """A callable importing ``module.attr`` on first use (megatron-core is imported only then)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = f"{module}.{attr}"
    return call


def builtin_specs() -> list[ModelSpec]:
    specs = []
    for family, (description, aliases) in _FAMILIES.items():
        config = importlib.import_module(f"{__package__}.{family}.config")
        specs.append(ModelSpec(
            name=family,
            config_from_hf=config.config_from_hf,
            hf_model_types=config.HF_MODEL_TYPES,
            hf_architectures=config.HF_ARCHITECTURES,
            aliases=aliases,
            description=description,
            layer_spec=_lazy(f"{__package__}.{family}.spec", "layer_spec"),
            weight_map=_lazy(f"{__package__}.{family}.weights", "weight_map"),
        ))
    return specs


@hookimpl
def ascend_patch_model_specs() -> list[ModelSpec]:
    return builtin_specs()
