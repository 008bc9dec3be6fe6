"""Llama (and Mistral-style variants): the HF <-> megatron-core weight map, shared by the llama-like families."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hf_config import ConfigMismatch, ModelConfig
from ..weightmap import QKV, GatedMLP, Replicated, RowParallel, Rule, VocabParallel, WeightMap
from .config import TRAITS

if TYPE_CHECKING:
    from ..traits import Traits

__all__ = ["weight_map", "llama_style_map"]

_L = "model.layers.{i}."
_M = "decoder.layers.{j}."


def llama_style_map(cfg: ModelConfig, *, qkv_bias: bool = False, qk_norm: bool = False,
                    traits: Traits | None = None) -> WeightMap:
    """GQA attention, RMSNorm, SwiGLU MLP; optional qkv bias and per-head q/k norm.

    Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm) and the MoE families use it too, passing their
    ``traits``, which decide both options (from the config where the family states neither).
    """
    if cfg.normalization != "RMSNorm" or cfg.activation != "swiglu":
        raise ConfigMismatch(f"{cfg.family}: the llama-style map needs RMSNorm and SwiGLU, the config has "
                             f"{cfg.normalization} and {cfg.activation}")
    if traits is not None:
        qk_norm, qkv_bias = traits.resolve(cfg.family, cfg.qk_layernorm, cfg.add_qkv_bias)
    if cfg.add_bias_linear:
        raise ConfigMismatch(f"{cfg.family}: linear-layer biases (other than q/k/v) are not part of this map")
    if cfg.num_attention_heads % cfg.num_query_groups:
        raise ConfigMismatch(f"{cfg.num_attention_heads} attention heads are not a multiple of "
                             f"{cfg.num_query_groups} key/value heads")
    h, f, d, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.kv_channels, cfg.vocab_size
    nh, ng = cfg.num_attention_heads, cfg.num_query_groups
    attn = _L + "self_attn."
    layer: list[Rule] = [
        Replicated(mg=_M + "input_layernorm.weight", te=_M + "self_attention.linear_qkv.layer_norm_weight",
                   hf=_L + "input_layernorm.weight", shape=(h,)),
        QKV(mg=_M + "self_attention.linear_qkv.weight", q=attn + "q_proj.weight", k=attn + "k_proj.weight",
            v=attn + "v_proj.weight", heads=nh, groups=ng, head_dim=d, rest=(h,)),
    ]
    if qkv_bias:
        layer.append(QKV(mg=_M + "self_attention.linear_qkv.bias", q=attn + "q_proj.bias", k=attn + "k_proj.bias",
                         v=attn + "v_proj.bias", heads=nh, groups=ng, head_dim=d, rest=()))
    if qk_norm:
        layer += [Replicated(mg=_M + "self_attention.q_layernorm.weight", hf=attn + "q_norm.weight", shape=(d,)),
                  Replicated(mg=_M + "self_attention.k_layernorm.weight", hf=attn + "k_norm.weight", shape=(d,))]
    layer += [
        RowParallel(mg=_M + "self_attention.linear_proj.weight", hf=attn + "o_proj.weight", shape=(h, nh * d)),
        Replicated(mg=_M + "pre_mlp_layernorm.weight", te=_M + "mlp.linear_fc1.layer_norm_weight",
                   hf=_L + "post_attention_layernorm.weight", shape=(h,)),
        GatedMLP(mg=_M + "mlp.linear_fc1.weight", gate=_L + "mlp.gate_proj.weight", up=_L + "mlp.up_proj.weight",
                 shape=(f, h)),
        RowParallel(mg=_M + "mlp.linear_fc2.weight", hf=_L + "mlp.down_proj.weight", shape=(h, f)),
    ]
    return WeightMap(
        config=cfg,
        embedding=(VocabParallel(mg="embedding.word_embeddings.weight", hf="model.embed_tokens.weight",
                                 shape=(v, h)),),
        layer=tuple(layer),
        final=(Replicated(mg="decoder.final_layernorm.weight", hf="model.norm.weight", shape=(h,)),),
        output=VocabParallel(mg="output_layer.weight", hf="lm_head.weight", shape=(v, h)),
        layer_extra_state=("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1",
                           "mlp.linear_fc2"),
        te_layer_extra_state=("self_attention.linear_proj", "self_attention.linear_qkv",
                              "self_attention.core_attention", "mlp.linear_fc1", "mlp.linear_fc2"),
    )


def weight_map(cfg: ModelConfig) -> WeightMap:
    """Llama / Mistral: no biases, no q/k norm; untied unless the config ties them."""
    if cfg.add_qkv_bias:  # what the traits refuse, and why
        raise ConfigMismatch("llama with attention_bias=true also has an o_proj bias, which megatron-core's "
                             "GPT layer cannot hold without biases on every linear layer; not supported")
    return llama_style_map(cfg, traits=TRAITS)
