"""Tiny random Hugging Face models made locally (nothing is downloaded), for the converter tests."""

from __future__ import annotations

import json
import os
from typing import Any

from helpers import REPO, child_env  # noqa: F401  (re-exported for the converter tests)


COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=128)

FAMILIES: dict[str, dict[str, Any]] = {
    # vocab 300 is no multiple of 128: exercises padding (384 at TP1, 512 at TP2) and trimming.
    "qwen3": dict(COMMON, vocab_size=300, head_dim=24, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "llama": dict(COMMON, vocab_size=300, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "qwen2": dict(COMMON, vocab_size=300, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "mistral": dict(COMMON, vocab_size=300, head_dim=16, tie_word_embeddings=False, sliding_window=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # MoE: 8 experts of width 32 (divisible by TP 2), top-2; qwen3_moe renormalises the top-k (norm_topk_prob)
    "qwen3_moe": dict(COMMON, vocab_size=300, head_dim=16, tie_word_embeddings=False, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[], rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "mixtral": dict(COMMON, vocab_size=300, intermediate_size=48, tie_word_embeddings=False, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}


def hf_classes(family: str) -> tuple[Any, Any]:
    import transformers

    names = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
             "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
             "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
             "mixtral": ("MixtralConfig", "MixtralForCausalLM")}[family]
    return getattr(transformers, names[0]), getattr(transformers, names[1])


def make_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A random fp32 model whose every parameter (biases and norms too) is non-trivial."""
    import torch

    config_cls, model_cls = hf_classes(family)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**FAMILIES[family], **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    return model


def save_model(model: Any, path: str, *, max_shard_size: str | None = None, old_style_config: bool = False) -> str:
    """save_pretrained (safetensors); ``old_style_config`` rewrites config.json as transformers 4 wrote it."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    if old_style_config:
        cfg_path = os.path.join(path, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        rope = cfg.pop("rope_parameters", None) or {}
        cfg["rope_theta"] = rope.get("rope_theta", 10000.0)
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
    return path


def reference_logits(model: Any, input_ids: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids).logits.float()


def hf_state(path: str) -> dict[str, Any]:
    """Every tensor of an HF safetensors checkpoint directory (single file or shards)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out
