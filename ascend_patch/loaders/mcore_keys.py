"""What megatron-core's GPTModel itself builds for a model chunk: its state-dict keys and shapes.

The model is built on the meta device (no memory, no initialisation) with a process-group
collection whose tensor-parallel group *reports* the target TP size, so the shapes are
megatron-core's own per-rank shapes (vocabulary partition, heads per partition, fused
QKV, gated fc1) for any TP without starting TP processes. Each chunk is built as a
one-stage model with its own layer count and ``pre_process`` / ``post_process`` flags,
which is how megatron-core names a pipeline stage's keys (stage-local layer indices).

The local spec is built (it needs nothing applied: this runs in the converter, outside any
patched process); the TE key set is derived from it: the pre-attention / pre-MLP norms fold
into ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight`` and ``core_attention``
gains an ``_extra_state``. That derivation is what a TE-spec ``GPTModel`` built on
ascend_patch's Transformer-Engine-compatible layer holds (``tests/megatron/test_te_spec.py``
compares the two), and what Megatron-LM's default ``--transformer-impl transformer_engine``
saves on npu and cpu.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from functools import lru_cache

from ..models.hf_config import ModelConfig
from ..parallel import Layout

__all__ = ["megatron_expected_state", "te_names"]

Shape = tuple[int, ...]


class _ReportedGroup:
    """Stands in for a process group when only its size and this rank's index are asked."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@contextlib.contextmanager
def _process_group() -> Iterator[None]:
    """megatron-core asks torch.distributed whether it is initialised; give it a 1-process gloo world."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="ascend_patch-keys-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _cfg_key(cfg: ModelConfig) -> tuple:
    return (cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels,
            cfg.add_qkv_bias, cfg.qk_layernorm, cfg.tie_word_embeddings, cfg.normalization, cfg.activation,
            cfg.max_position_embeddings, cfg.rotary_base, cfg.num_experts, cfg.moe_ffn_hidden_size)


@lru_cache(maxsize=64)
def _build(cfg_key: tuple, layers: int, pre: bool, post: bool, tp: int, padded_vocab: int,
           ep: int = 1, grouped: bool = False) -> tuple[tuple[str, Shape | None], ...]:
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    (hidden, ffn, heads, groups, kv, qkv_bias, qk_norm, tied, norm, act, max_pos, theta, experts, expert_ffn) = cfg_key
    moe = dict(num_moe_experts=experts, moe_ffn_hidden_size=expert_ffn, expert_model_parallel_size=ep,
               moe_grouped_gemm=grouped) if experts else {}
    config = TransformerConfig(**moe,
        num_layers=max(layers, 1), hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=groups, kv_channels=kv, gated_linear_unit=act == "swiglu",
        activation_func=F.silu if act == "swiglu" else F.gelu, add_bias_linear=False, add_qkv_bias=qkv_bias,
        normalization=norm, qk_layernorm=qk_norm, tensor_model_parallel_size=tp, use_cpu_initialization=True,
        perform_initialization=False, hidden_dropout=0.0, attention_dropout=0.0)
    groups_pc = ProcessGroupCollection()
    groups_pc.tp = _ReportedGroup(tp, 0)
    groups_pc.pp = _ReportedGroup(1, 0)
    groups_pc.cp = _ReportedGroup(1, 0)
    groups_pc.embd = None
    if experts:  # expert-TP = TP in the legacy layout; this rank is EP rank 0 (every EP rank has the same keys)
        groups_pc.ep = _ReportedGroup(ep, 0)
        groups_pc.expt_tp = _ReportedGroup(tp, 0)
        groups_pc.tp_ep = _ReportedGroup(tp * ep, 0)
        groups_pc.expt_dp = _ReportedGroup(1, 0)
        groups_pc.tp_cp = _ReportedGroup(tp, 0)
        groups_pc.dp = _ReportedGroup(1, 0)
        groups_pc.tp_dp_cp = _ReportedGroup(tp, 0)
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=grouped, qk_layernorm=qk_norm,
                                    normalization=norm)
    with _process_group(), torch.device("meta"):
        model = GPTModel(config, spec,
                         vocab_size=padded_vocab, max_sequence_length=max_pos, pre_process=pre, post_process=post,
                         share_embeddings_and_output_weights=tied, position_embedding_type="rope",
                         rotary_base=int(theta) if float(theta).is_integer() else theta, pg_collection=groups_pc)
        state = model.state_dict()
    out = []
    for key, value in state.items():
        if layers == 0 and key.startswith("decoder.layers."):
            continue
        out.append((key, tuple(value.shape) if isinstance(value, torch.Tensor) else None))
    return tuple(out)


_EXPERT = re.compile(r"(decoder\.layers\.\d+\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12])\.(weight|_extra_state)$")


def te_names(state: dict[str, Shape | None], grouped: bool = False) -> dict[str, Shape | None]:
    """The TE-spec spelling of a local-spec state dict (see the module docstring).

    A dense layer's pre-MLP norm folds into ``mlp.linear_fc1``; an MoE layer's stays
    ``pre_mlp_layernorm`` (megatron-core folds it only in front of a dense MLP). ``grouped``:
    the experts as TEGroupedMLP names them (``mlp.experts.linear_fc1.weight{x}``, one
    ``_extra_state`` per grouped linear) instead of SequentialMLP's ``local_experts.{x}``.
    """
    out: dict[str, Shape | None] = {}
    for key, shape in state.items():
        m = re.match(r"(decoder\.layers\.\d+\.)(input_layernorm|pre_mlp_layernorm)\.weight$", key)
        if m and (m.group(2) == "input_layernorm" or f"{m.group(1)}mlp.linear_fc1.weight" in state):
            target = "self_attention.linear_qkv" if m.group(2) == "input_layernorm" else "mlp.linear_fc1"
            out[f"{m.group(1)}{target}.layer_norm_weight"] = shape
            continue
        e = _EXPERT.match(key) if grouped else None
        if e:
            prefix, x, linear, what = e.groups()
            if what == "weight":
                out[f"{prefix}{linear}.weight{x}"] = shape
            else:
                out[f"{prefix}{linear}._extra_state"] = None
            continue
        out[key] = shape
        m = re.match(r"(decoder\.layers\.\d+\.)self_attention\.linear_proj\._extra_state$", key)
        if m:
            out[f"{m.group(1)}self_attention.core_attention._extra_state"] = None
    return out


def megatron_expected_state(cfg: ModelConfig, layout: Layout, pp_rank: int, vp: int = 0,
                            naming: str = "local", padded_vocab: int | None = None) -> dict[str, Shape | None]:
    """Keys (and shapes; None for ``_extra_state``) megatron-core's GPTModel has for this chunk."""
    layers = len(layout.layers(pp_rank, vp))
    state = dict(_build(_cfg_key(cfg), layers, layout.is_first(pp_rank, vp), layout.is_last(pp_rank, vp),
                        layout.tp, padded_vocab or cfg.vocab_size, layout.ep if cfg.is_moe else 1))
    return te_names(state, grouped=naming == "te_grouped") if naming in ("te", "te_grouped") else state
