"""Hugging Face ``config.json`` -> one normalised :class:`ModelConfig` for every family."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..dtypes import short_name
from ..errors import ConfigMismatch

if TYPE_CHECKING:
    from .traits import Traits

__all__ = ["ModelConfig", "ConfigMismatch", "hf_config_dict", "load_hf_config", "read_config_json",
           "rope_scaling_kwargs", "sliding_window"]


# Configs are read as they are written today and as they were: transformers 5.x
# writes ``dtype`` and nests rope settings (``"rope_parameters": {"rope_theta": ...}``);
# older files have ``torch_dtype`` and a top-level ``rope_theta`` / ``rope_scaling``.
#
# What a config asks for that the megatron-core model built from it will not do is kept,
# not dropped: ``sliding_window`` (Mistral v0.1; Qwen2/3 with ``use_sliding_window``) is
# recorded in :attr:`ModelConfig.sliding_window` and explained in :attr:`ModelConfig.notes`
# (the family specs attend over the full causal context). The weights do not depend on it,
# so conversion goes on; :func:`.transformer_config.transformer_config` warns with the note.
@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a decoder-only transformer, in the terms Megatron uses."""

    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rotary_base: float
    tie_word_embeddings: bool
    qk_layernorm: bool = False
    add_qkv_bias: bool = False
    add_bias_linear: bool = False
    normalization: str = "RMSNorm"
    activation: str = "swiglu"
    position_embedding_type: str = "rope"
    rope_scaling: Mapping[str, Any] | None = None
    params_dtype: str = "fp32"
    architectures: tuple[str, ...] = ()
    sliding_window: int | None = None  # enabled in config.json and shorter than the context; not built
    hidden_dropout: float = 0.0  # the dropout rates the family's config.json trains with
    attention_dropout: float = 0.0
    # mixture of experts (None: a dense MLP); every layer's MLP is then a router over the experts
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None  # one expert's intermediate size
    moe_router_topk: int = 2
    moe_router_pre_softmax: bool = False  # softmax over all experts before top-k, no renormalisation
    moe_aux_loss_coeff: float = 0.0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def head_dim(self) -> int:
        return self.kv_channels

    @property
    def notes(self) -> list[str]:
        """What config.json asks for that the megatron-core model built from this config does not do."""
        notes = []
        if self.sliding_window:
            w = self.sliding_window
            notes.append(f"config.json enables sliding-window attention (sliding_window={w}: each token attends to "
                         f"the last {w} positions), which the '{self.family}' layer spec does not build: it attends "
                         f"over the whole causal context, so sequences longer than {w} tokens give other results "
                         "than the Hugging Face model (shorter ones are identical; the weights are unaffected)")
        return notes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw")
        return d

    def megatron_args(self, make_vocab_size_divisible_by: int = 128, tensor_parallel_size: int = 1) -> dict[str, Any]:
        """The Megatron command-line arguments for this model (flag name -> value; True = bare flag).

        ``tensor_parallel_size`` does not change the flags (Megatron pads for TP itself); it is
        accepted so callers can pass the launch's sizes uniformly.
        """
        args: dict[str, Any] = {
            "num-layers": self.num_layers,
            "hidden-size": self.hidden_size,
            "ffn-hidden-size": self.ffn_hidden_size,
            "num-attention-heads": self.num_attention_heads,
        }
        if self.num_query_groups != self.num_attention_heads:
            args["group-query-attention"] = True
            args["num-query-groups"] = self.num_query_groups
        args["kv-channels"] = self.kv_channels
        args["max-position-embeddings"] = self.max_position_embeddings
        args["position-embedding-type"] = self.position_embedding_type
        if self.position_embedding_type == "rope":
            args["rotary-base"] = int(self.rotary_base) if float(self.rotary_base).is_integer() else self.rotary_base
            if self.rope_scaling:
                scaling = rope_scaling_kwargs(self.rope_scaling)  # refuses what Megatron cannot express
                args["use-rope-scaling"] = True
                args["rope-scaling-factor"] = scaling["rope_scaling_factor"]
        args["normalization"] = self.normalization
        args["norm-epsilon"] = self.norm_epsilon
        # the rates config.json trains with: Megatron's default (0.1 both) is not the model's when they differ
        args["hidden-dropout"] = self.hidden_dropout
        args["attention-dropout"] = self.attention_dropout
        if self.activation == "swiglu":
            args["swiglu"] = True
        if not self.add_bias_linear:
            args["disable-bias-linear"] = True
        if self.add_qkv_bias:
            args["add-qkv-bias"] = True
        if self.qk_layernorm:
            args["qk-layernorm"] = True
        if not self.tie_word_embeddings:
            args["untie-embeddings-and-output-weights"] = True
        # Megatron pads --vocab-size to a multiple of the divisor x TP itself (see padded_vocab);
        # it has no flag for the padded size, so the argv carries the true size only.
        args["vocab-size"] = self.vocab_size
        args["make-vocab-size-divisible-by"] = make_vocab_size_divisible_by
        if self.is_moe:
            args.update(self.moe_args())
        if self.params_dtype in ("bf16", "fp16"):
            args[self.params_dtype] = True
        return args

    def moe_args(self) -> dict[str, Any]:
        """The Megatron-LM MoE flags (``--num-experts`` ...); empty for a dense model."""
        if not self.is_moe:
            return {}
        args: dict[str, Any] = {
            "num-experts": self.num_experts,
            "moe-ffn-hidden-size": self.moe_ffn_hidden_size or self.ffn_hidden_size,
            "moe-router-topk": self.moe_router_topk,
            "moe-router-load-balancing-type": "aux_loss" if self.moe_aux_loss_coeff else "none",
        }
        if self.moe_aux_loss_coeff:
            args["moe-aux-loss-coeff"] = self.moe_aux_loss_coeff
        if self.moe_router_pre_softmax:
            args["moe-router-pre-softmax"] = True
        return args

    def padded_vocab(self, make_vocab_size_divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
        """The embedding rows Megatron builds: the vocabulary padded to divisor x TP."""
        from .vocab import padded_vocab_size

        return padded_vocab_size(self.vocab_size, make_vocab_size_divisible_by, tensor_parallel_size)

    def megatron_argv(self, **kwargs: Any) -> list[str]:
        """:meth:`megatron_args` as an argv list (``--num-layers 28 --swiglu ...``)."""
        argv: list[str] = []
        for key, value in self.megatron_args(**kwargs).items():
            argv.append(f"--{key}")
            if value is not True:
                argv.append(str(value))
        return argv


# megatron-core's RoPE scaling is Llama 3.x's with these constants fixed (only the factor is free)
_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_scaling_kwargs(scaling: Mapping[str, Any] | None) -> dict[str, Any]:
    """``GPTModel``'s ``rope_scaling`` / ``rope_scaling_factor`` for an HF ``rope_scaling`` entry."""
    if not scaling:
        return {"rope_scaling": False}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ConfigMismatch(f"rope scaling of type {kind!r} has no megatron-core GPTModel counterpart "
                             "(it implements Llama 3.x scaling only)")
    for key, fixed in _LLAMA3_FIXED.items():
        if key in scaling and float(scaling[key]) != fixed:
            raise ConfigMismatch(f"llama3 rope scaling with {key}={scaling[key]}: megatron-core fixes it at {fixed}")
    return {"rope_scaling": True, "rope_scaling_factor": float(scaling.get("factor", 8.0))}


def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The config dict from a ``config.json`` file or a checkpoint directory holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigMismatch(f"no config.json at {path}") from None
    except json.JSONDecodeError as exc:
        raise ConfigMismatch(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigMismatch(f"{path} does not hold a JSON object")
    return data


def _need(cfg: Mapping[str, Any], key: str, family: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigMismatch(f"config.json for a {family} model has no {key!r}")
    return cfg[key]


def rope_settings(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, scaling settings or None) from either the nested or the top-level form."""
    params = cfg.get("rope_parameters")
    scaling: dict[str, Any] | None = None
    theta = cfg.get("rope_theta")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", theta)
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in (None, "default"):
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    legacy = cfg.get("rope_scaling")
    if scaling is None and isinstance(legacy, Mapping) and legacy.get("rope_type", legacy.get("type")) not in (None, "default"):
        scaling = dict(legacy)
    return float(theta if theta is not None else 10000.0), scaling


def params_dtype(cfg: Mapping[str, Any]) -> str:
    raw = cfg.get("dtype", cfg.get("torch_dtype")) or "float32"
    return short_name(raw, default="fp32")


def sliding_window(cfg: Mapping[str, Any]) -> int | None:
    """The sliding-window span ``cfg`` enables, or None: unset, switched off (``use_sliding_window``
    false, as Qwen2/3 ship), or no shorter than ``max_position_embeddings`` (then it changes nothing)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window", True) is False:
        return None
    return int(window) if int(window) < int(cfg.get("max_position_embeddings", 4096)) else None


def load_hf_config(cfg: Mapping[str, Any], family: str, *, qk_layernorm: bool = False,
                   add_qkv_bias: bool | None = None, default_tied: bool = False,
                   traits: Traits | None = None) -> ModelConfig:
    """Normalise a llama-style config (llama, mistral, qwen2, qwen3) into a ModelConfig.

    ``traits`` (the family's :class:`~.traits.Traits`) decide the three keywords: q/k norm
    and the q/k/v bias where the family always has them (else ``attention_bias`` says), and
    whether embeddings are tied when config.json does not say.
    """
    if traits is not None:
        qk_layernorm = bool(traits.qk_norm)
        add_qkv_bias = True if traits.qkv_bias else None
        default_tied = traits.tied
    heads = int(_need(cfg, "num_attention_heads", family))
    hidden = int(_need(cfg, "hidden_size", family))
    groups = int(cfg.get("num_key_value_heads") or heads)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigMismatch(f"hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                                 "and config.json gives no head_dim")
        head_dim = hidden // heads
    act = str(cfg.get("hidden_act", "silu"))
    if act not in ("silu", "swish"):
        raise ConfigMismatch(f"{family} models with hidden_act={act!r} are not supported (SwiGLU needs silu)")
    theta, scaling = rope_settings(cfg)
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        num_layers=int(_need(cfg, "num_hidden_layers", family)),
        hidden_size=hidden,
        ffn_hidden_size=int(_need(cfg, "intermediate_size", family)),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=int(head_dim),
        vocab_size=int(_need(cfg, "vocab_size", family)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        norm_epsilon=float(cfg.get("rms_norm_eps", 1e-6)),
        rotary_base=theta,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", default_tied)),
        qk_layernorm=qk_layernorm,
        add_qkv_bias=bias if add_qkv_bias is None else add_qkv_bias,
        rope_scaling=scaling,
        params_dtype=params_dtype(cfg),
        architectures=tuple(cfg.get("architectures") or ()),
        sliding_window=sliding_window(cfg),
        hidden_dropout=float(cfg.get("hidden_dropout") or 0.0),
        attention_dropout=float(cfg.get("attention_dropout") or 0.0),
        raw=dict(cfg),
    )


def hf_config_dict(cfg: ModelConfig, dtype: str, model_types: Sequence[str], architectures: Sequence[str],
                   attention_bias: bool | None = None) -> dict[str, Any]:
    """A transformers ``config.json`` for a llama-style model known only from Megatron args.

    The family passes its HF model types and architectures (pairwise); the config's own
    model type is kept when the family serves it (a Mistral stays a Mistral).
    ``attention_bias`` is written as given, else from the q/k/v bias.
    """
    model_type = cfg.model_type if cfg.model_type in model_types else model_types[0]
    return {
        "architectures": [architectures[list(model_types).index(model_type)]],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_query_groups,
        "head_dim": cfg.kv_channels,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.norm_epsilon,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base},
        "rope_theta": cfg.rotary_base,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": bool(cfg.add_qkv_bias) if attention_bias is None else attention_bias,
        "dtype": dtype,
    }
