"""qwen3_moe and mixtral as family folders: config both ways, Megatron arguments, refusals, layer spec."""

from __future__ import annotations

import pytest

from ascend_patch.models.hf_config import ConfigMismatch
from ascend_patch.models.registry import get_spec_registry

QWEN3_MOE = {  # Qwen3-30B-A3B's config.json (the fields that matter), as transformers 5 writes it
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
    "dtype": "bfloat16"}
MIXTRAL = {  # Mixtral-8x7B
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "sliding_window": None}


def test_qwen3_moe_megatron_arguments():
    spec = get_spec_registry().for_hf_config(QWEN3_MOE)
    assert spec.name == "qwen3_moe" and get_spec_registry().get("Qwen3-MoE") is spec
    args = spec.config_from_hf(QWEN3_MOE).megatron_args()
    assert {k: args[k] for k in ("num-experts", "moe-ffn-hidden-size", "moe-router-topk",
                                 "moe-router-load-balancing-type", "moe-aux-loss-coeff")} == {
        "num-experts": 128, "moe-ffn-hidden-size": 768, "moe-router-topk": 8,
        "moe-router-load-balancing-type": "aux_loss", "moe-aux-loss-coeff": 0.001}
    assert args["qk-layernorm"] is True and "moe-router-pre-softmax" not in args
    # without renormalised top-k, Qwen3-MoE's router is softmax over all experts: megatron's pre-softmax
    unnormalised = spec.config_from_hf({**QWEN3_MOE, "norm_topk_prob": False}).megatron_args()
    assert unnormalised["moe-router-pre-softmax"] is True


def test_mixtral_megatron_arguments_and_config_back():
    spec = get_spec_registry().for_hf_config(MIXTRAL)
    cfg = spec.config_from_hf(MIXTRAL)
    args = cfg.megatron_args()
    assert (args["num-experts"], args["moe-router-topk"], args["moe-ffn-hidden-size"]) == (8, 2, 14336)
    assert args["moe-aux-loss-coeff"] == 0.02 and "qk-layernorm" not in args
    back = spec.config_to_hf(cfg, "bfloat16")
    assert (back["model_type"], back["num_local_experts"], back["num_experts_per_tok"], back["intermediate_size"]) \
        == ("mixtral", 8, 2, 14336)
    assert spec.config_from_hf(back) == cfg


def test_qwen3_moe_with_dense_layers_is_refused_with_the_reason():
    spec = get_spec_registry().get("qwen3_moe")
    with pytest.raises(ConfigMismatch, match=r"mlp_only_layers=\[0, 47\], decoder_sparse_step=1\) is not supported"):
        spec.config_from_hf({**QWEN3_MOE, "mlp_only_layers": [0, 47]})


def test_weight_map_counts_and_layer_spec_builds():
    spec = get_spec_registry().get("qwen3_moe")
    small = {**QWEN3_MOE, "num_hidden_layers": 2, "num_experts": 4}
    cfg = spec.config_from_hf(small)
    wm = spec.weight_map(cfg)
    hf = wm.hf_tensors()
    assert hf["model.layers.1.mlp.experts.3.down_proj.weight"] == (2048, 768)
    assert hf["model.layers.0.mlp.gate.weight"] == (4, 2048)
    assert not any(k.endswith("mlp.gate_proj.weight") for k in hf)  # no dense MLP in an MoE layer
    assert len(hf) == 1 + 2 * (9 + 4 * 3) + 2  # embed, per layer 9 + 3 per expert, norm, lm_head
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layer = spec.layer_spec(cfg)
    assert layer.submodules.mlp.module is MoELayer
    assert layer.submodules.mlp.submodules.experts.module is SequentialMLP
