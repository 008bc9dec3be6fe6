"""HF GPT-2 ``config.json`` -> ModelConfig (LayerNorm, GeLU, learned absolute positions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hf_config import ConfigMismatch, ModelConfig, params_dtype
from ..traits import Traits

HF_MODEL_TYPES = ("gpt2",)
HF_ARCHITECTURES = ("GPT2LMHeadModel",)
TRAITS = Traits(normalization="LayerNorm", swiglu=False, qk_norm=None, qkv_bias=None, tied=True)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    try:
        hidden, heads, layers = int(cfg["n_embd"]), int(cfg["n_head"]), int(cfg["n_layer"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise ConfigMismatch(f"config.json for a gpt model has no {exc.args[0]!r}") from None
    return ModelConfig(
        family="gpt", model_type=str(cfg.get("model_type", "gpt2")), num_layers=layers, hidden_size=hidden,
        ffn_hidden_size=int(cfg.get("n_inner") or 4 * hidden), num_attention_heads=heads,
        num_query_groups=heads, kv_channels=hidden // heads, vocab_size=vocab,
        max_position_embeddings=int(cfg.get("n_positions", 1024)),
        norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)), rotary_base=10000.0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", TRAITS.tied)), add_bias_linear=True,
        add_qkv_bias=True, normalization="LayerNorm", activation="gelu",
        position_embedding_type="learned_absolute", params_dtype=params_dtype(cfg),
        hidden_dropout=float(cfg.get("resid_pdrop", 0.1)), attention_dropout=float(cfg.get("attn_pdrop", 0.1)),
        architectures=tuple(cfg.get("architectures") or ()), raw=dict(cfg))
