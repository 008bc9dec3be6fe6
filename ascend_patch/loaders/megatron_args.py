"""Megatron's ``args`` Namespace for a converted checkpoint, and a ModelConfig (and the true vocabulary) back from one."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..dtypes import FLOATING, short_name
from ..errors import AscendPatchError
from ..models.hf_config import ModelConfig
from ..parallel import Layout

__all__ = ["build_args", "config_from_args", "ArgsMismatch", "source_vocab", "tokenizer_vocab"]


# The saver records the arguments Megatron-LM's ``load_args_from_checkpoint`` and
# ``check_checkpoint_args`` read (sizes, attention layout, normalisation, parallel sizes,
# vocabulary padding, dtype); the loader reads the same names from checkpoints Megatron-LM
# wrote, so mg -> mg and mg -> hf need no HF files.
class ArgsMismatch(AscendPatchError, ValueError):
    """A checkpoint's ``args`` lack a field the converter needs."""


def build_args(cfg: ModelConfig, layout: Layout, *, padded_vocab: int, divisor: int, dtype: str,
               naming: str, iteration: int | str) -> argparse.Namespace:
    """The ``args`` to store in every rank file (``params_dtype`` pickles as ``torch.<dtype>``)."""
    from .torch_zip import TORCH_DTYPES

    params_dtype = TORCH_DTYPES[dtype if dtype in FLOATING else "float32"]
    vpp = layout.vpp if layout.vpp > 1 else None
    return argparse.Namespace(
        model_type="GPT", use_legacy_models=False, use_mcore_models=True, ckpt_format="torch",
        transformer_impl="transformer_engine" if naming in ("te", "te_grouped") else "local",
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.ffn_hidden_size,
        num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.num_query_groups,
        group_query_attention=cfg.num_query_groups != cfg.num_attention_heads, kv_channels=cfg.kv_channels,
        max_position_embeddings=cfg.max_position_embeddings, seq_length=cfg.max_position_embeddings,
        position_embedding_type=cfg.position_embedding_type,
        # Megatron-LM's own value for every model (only --no-position-embedding, deprecated, clears it);
        # check_checkpoint_args refuses a resume whose checkpoint says otherwise
        add_position_embedding=True,
        use_rotary_position_embeddings=cfg.position_embedding_type == "rope", rotary_base=cfg.rotary_base,
        rotary_percent=1.0, rotary_interleaved=False,
        normalization=cfg.normalization, norm_epsilon=cfg.norm_epsilon, apply_layernorm_1p=False,
        swiglu=cfg.activation == "swiglu", squared_relu=False, add_bias_linear=cfg.add_bias_linear,
        add_qkv_bias=cfg.add_qkv_bias, qk_layernorm=cfg.qk_layernorm,
        untie_embeddings_and_output_weights=not cfg.tie_word_embeddings,
        attention_dropout=0.0, hidden_dropout=0.0,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=vpp,
        num_layers_per_virtual_pipeline_stage=layout.layer_counts[0] if vpp and layout.even else None,
        num_layer_list=None if layout.even else ",".join(map(str, layout.layer_counts)),
        decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp,
        data_parallel_size=layout.dp, world_size=layout.world_size,
        num_experts=cfg.num_experts, moe_ffn_hidden_size=cfg.moe_ffn_hidden_size if cfg.is_moe else None,
        moe_router_topk=cfg.moe_router_topk if cfg.is_moe else 2, moe_router_pre_softmax=cfg.moe_router_pre_softmax,
        moe_router_load_balancing_type="aux_loss" if cfg.moe_aux_loss_coeff else "none",
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff, moe_grouped_gemm=naming == "te_grouped",
        vocab_size=cfg.vocab_size, padded_vocab_size=padded_vocab, make_vocab_size_divisible_by=divisor,
        params_dtype=params_dtype, bf16=dtype == "bfloat16", fp16=dtype == "float16",
        iteration=0 if iteration == "release" else iteration, consumed_train_samples=0, consumed_valid_samples=0,
    )


def _get(args: Any, name: str, default: Any = None) -> Any:
    if isinstance(args, Mapping):
        return args.get(name, default)
    return getattr(args, name, default)


def config_from_args(args: Any, family: str, vocab_size: int | None, base: Mapping[str, Any] | None = None) -> ModelConfig:
    """A ModelConfig from Megatron ``args`` (``base``: an HF config dict the checkpoint carried)."""
    missing = [n for n in ("num_layers", "hidden_size", "num_attention_heads") if _get(args, n) is None]
    if missing:
        raise ArgsMismatch(f"the checkpoint's args have no {', '.join(missing)}")
    heads = int(_get(args, "num_attention_heads"))
    hidden = int(_get(args, "hidden_size"))
    groups = int(_get(args, "num_query_groups") or heads) if _get(args, "group_query_attention", True) else heads
    kv = int(_get(args, "kv_channels") or hidden // heads)
    swiglu = bool(_get(args, "swiglu", False))
    dtype = _get(args, "params_dtype")
    if dtype is None:
        dtype = "bfloat16" if _get(args, "bf16") else "float16" if _get(args, "fp16") else "float32"
    short = short_name(dtype, default="fp32")
    norm = str(_get(args, "normalization", "LayerNorm"))
    padded = _get(args, "padded_vocab_size")
    vocab = vocab_size or _get(args, "vocab_size") or padded
    if vocab is None:
        raise ArgsMismatch("the checkpoint's args give neither vocab_size nor padded_vocab_size; pass --true-vocab-size")
    raw = dict(base or {})
    theta = _get(args, "rotary_base", 10000)
    experts = _get(args, "num_experts")
    aux = _get(args, "moe_aux_loss_coeff", 0.0)
    balancing = _get(args, "moe_router_load_balancing_type", "aux_loss")
    return ModelConfig(
        family=family, model_type=str(raw.get("model_type", family)),
        num_layers=int(_get(args, "num_layers")), hidden_size=hidden,
        ffn_hidden_size=int(_get(args, "ffn_hidden_size") or 4 * hidden), num_attention_heads=heads,
        num_query_groups=groups, kv_channels=kv, vocab_size=int(vocab),
        max_position_embeddings=int(_get(args, "max_position_embeddings") or 4096),
        norm_epsilon=float(_get(args, "norm_epsilon", _get(args, "layernorm_epsilon", 1e-5))),
        rotary_base=float(theta if theta is not None else 10000),
        tie_word_embeddings=not bool(_get(args, "untie_embeddings_and_output_weights", False)),
        qk_layernorm=bool(_get(args, "qk_layernorm", False)), add_qkv_bias=bool(_get(args, "add_qkv_bias", False)),
        add_bias_linear=bool(_get(args, "add_bias_linear", True)), normalization=norm,
        activation="swiglu" if swiglu else "gelu",
        position_embedding_type=str(_get(args, "position_embedding_type", "learned_absolute")),
        params_dtype=short, architectures=tuple(raw.get("architectures") or ()), raw=raw,
        num_experts=int(experts) if experts else None,
        moe_ffn_hidden_size=int(_get(args, "moe_ffn_hidden_size") or _get(args, "ffn_hidden_size") or 4 * hidden)
        if experts else None,
        moe_router_topk=int(_get(args, "moe_router_topk") or 2),
        moe_router_pre_softmax=bool(_get(args, "moe_router_pre_softmax", False)),
        # Megatron-LM takes one coefficient (and type) per loss, as a list
        moe_aux_loss_coeff=float((aux[0] if isinstance(aux, (list, tuple)) else aux) or 0.0)
        if "aux_loss" in str(balancing) else 0.0,
    )


# Megatron-LM's tokenizers by what decides their size (megatron/training/tokenizer/tokenizer.py up to
# core 0.16, megatron/core/tokenizers from 0.17): these read it from files the checkpoint does not hold,
# whatever --vocab-size says
_FROM_FILES = ("BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
               "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "MultimodalTokenizer",
               "SFTTokenizer")
_MISSING = object()


def source_vocab(true_vocab_size: int | None, meta: Mapping[str, Any], args: Any) -> tuple[int | None, str]:
    """A Megatron checkpoint's true vocabulary and how it is known: ``--true-vocab-size``, the size
    ascend-patch recorded when it wrote the checkpoint, else Megatron's own rule (:func:`tokenizer_vocab`)."""
    if true_vocab_size:
        return int(true_vocab_size), f"--true-vocab-size {true_vocab_size}"
    if meta.get("vocab_size"):
        return int(meta["vocab_size"]), "as ascend-patch convert recorded it in the checkpoint"
    return tokenizer_vocab(args)


def tokenizer_vocab(args: Any) -> tuple[int | None, str]:
    """(the vocabulary Megatron-LM's tokenizer had when it wrote a checkpoint with these ``args``, how that is
    known); None when the args cannot tell, and the second part then says why.

    * NullTokenizer / NullMultimodalTokenizer: ``--vocab-size`` ids, then the end-of-document id
      Megatron adds after them (``vocab_size + 1``, which the padded vocabulary is computed from).
      Megatron-LM main's NullTokenizer (its args carry ``null_tokenizer_eod_id``) counts the
      end-of-document id inside ``--vocab-size`` instead;
    * TikTokenizer: ``--vocab-size``, 2**17 without it;
    * tokenizers read from files (GPT2BPE, SentencePiece, HuggingFace, ...): unknown;
    * no tokenizer recorded (a checkpoint another tool wrote): ``args.vocab_size`` when present.
    """
    kind = _get(args, "tokenizer_type")
    size = _get(args, "vocab_size")
    if kind in ("NullTokenizer", "NullMultimodalTokenizer") and size is not None:
        eod = _get(args, "null_tokenizer_eod_id", _MISSING)
        if kind == "NullTokenizer" and eod is not _MISSING:
            eod = int(size) - 1 if eod is None else eod
            return int(size), (f"--tokenizer-type NullTokenizer --vocab-size {size} (Megatron-LM's newer NullTokenizer: "
                               f"its end-of-document id {eod} is one of them)")
        return int(size) + 1, (f"--tokenizer-type {kind} --vocab-size {size}, plus the end-of-document id {size} "
                               "Megatron's tokenizer adds")
    if kind == "TikTokenizer":
        if size:
            return int(size), f"--tokenizer-type TikTokenizer --vocab-size {size}"
        return 2**17, "--tokenizer-type TikTokenizer without --vocab-size (its default, 131072)"
    if kind in _FROM_FILES:
        return None, f"--tokenizer-type {kind} reads its vocabulary from files, which the checkpoint does not hold"
    if size is not None:
        return int(size), "the vocab_size in the checkpoint's args"
    return None, "the checkpoint's args record neither a tokenizer nor a vocabulary size"

