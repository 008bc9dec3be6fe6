"""A checkpoint in MindSpeed-LLM's converter layout, written here from a Hugging Face Qwen3 (dense, TP1).

The layout, as MindSpeed-LLM v26.1.0's ``convert_ckpt_v2.py`` (``mindspeed_llm/tasks/checkpoint``)
documents and writes it, rebuilt from that description (no MindSpeed-LLM code):
``latest_checkpointed_iteration.txt`` = ``1``; ``iter_0000001/mp_rank_TT[_PPP]/model_optim_rng.pt``
holding ``{"args", "checkpoint_version": 3.0, "iteration": 1, "model"}`` and no optimizer or RNG
state; ``model`` keys are megatron-core's local-spec names, QKV interleaved per query group
(each group's queries, then its key, then its value), ``linear_fc1`` = [gate; up], no ``_extra_state``;
``args`` is an ``argparse.Namespace`` packed from config.json (every scalar/list key), the keys their
``configs/checkpoint/model_cfg.json`` maps or sets for ``qwen3`` (over ``base``), and the
converter's own scalar attributes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_msl_checkpoint"]

# model_cfg.json "base" + "qwen3": config_set_value (qwen3 over base) and config_hf_key_mapping
SET_VALUES = {"seq_length": 4096, "global_batch_size": 64, "add_position_embedding": True,
              "use_rotary_position_embeddings": True, "add_bias_linear": False, "gradient_accumulation_fusion": False,
              "normalization": "RMSNorm", "swiglu": True, "tokenizer_type": "Llama2Tokenizer",
              "group_query_attention": False, "qkv_type": "unpack", "fc_type": "gate_up_down", "qk_layernorm": True}
HF_KEYS = {"max_position_embeddings": "max_position_embeddings", "hidden_size": "hidden_size",
           "num_attention_heads": "num_attention_heads", "num_layers": "num_hidden_layers",
           "num_key_value_heads": "num_key_value_heads", "vocab_size": "vocab_size",
           "intermediate_size": "intermediate_size", "norm_epsilon": "rms_norm_eps",
           "tie_word_embeddings": "tie_word_embeddings", "torch_dtype": "torch_dtype", "rotary_base": "rope_theta",
           "kv_channels": "head_dim"}


def _args(config: dict[str, Any], load_dir: str, save_dir: str) -> argparse.Namespace:
    packed = {k: v for k, v in config.items() if isinstance(v, (int, float, str, bool, list))}
    packed.update({target: config[hf] for target, hf in HF_KEYS.items() if hf in config})
    packed.update(SET_VALUES)
    packed["untie_embeddings_and_output_weights"] = not config.get("tie_word_embeddings", False)
    packed.update(model_type_hf="qwen3", transformer_impl="local", tensor_model_parallel_size=1,
                  pipeline_model_parallel_size=1, expert_model_parallel_size=1, expert_tensor_parallel_size=1,
                  moe_grouped_gemm=False, moe_tp_extend_ep=False, mla_mm_split=False, mtp_num_layers=0,
                  first_k_dense_replace=0, load_dir=load_dir, save_dir=save_dir, save_layer_by_layer=False)
    return argparse.Namespace(**packed)


def write_msl_checkpoint(hf_dir: Path, out: Path) -> dict[str, Any]:
    """Write ``hf_dir``'s Qwen3 in MindSpeed-LLM's converter layout at TP1 PP1 into ``out``; returns the model dict."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    hf = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            hf.update(load_file(str(hf_dir / name)))
    heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
    dim, hidden = config["head_dim"], config["hidden_size"]
    model = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    for i in range(config["num_hidden_layers"]):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[src + "self_attn.q_proj.weight"].reshape(groups, dim * heads // groups, hidden)
        k = hf[src + "self_attn.k_proj.weight"].reshape(groups, dim, hidden)
        v = hf[src + "self_attn.v_proj.weight"].reshape(groups, dim, hidden)
        model[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        model[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        model[dst + "self_attention.q_layernorm.weight"] = hf[src + "self_attn.q_norm.weight"]
        model[dst + "self_attention.k_layernorm.weight"] = hf[src + "self_attn.k_norm.weight"]
        model[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        model[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        model[dst + "mlp.linear_fc1.weight"] = torch.cat([hf[src + "mlp.gate_proj.weight"],
                                                         hf[src + "mlp.up_proj.weight"]], dim=0)
        model[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    model["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not config.get("tie_word_embeddings", False):
        model["output_layer.weight"] = hf["lm_head.weight"]
    rank = out / "iter_0000001" / "mp_rank_00"
    rank.mkdir(parents=True)
    torch.save({"args": _args(config, str(hf_dir), str(out)), "checkpoint_version": 3.0, "iteration": 1,
                "model": {k: v.clone() for k, v in model.items()}}, rank / "model_optim_rng.pt")
    (out / "latest_checkpointed_iteration.txt").write_text("1")
    return model
