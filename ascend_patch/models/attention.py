"""Core attention with context parallelism for megatron-core layer specs (the family specs); imports megatron-core."""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

from ..ops.context_parallel import COMM_TYPES, all_gather_sequence, attend, context_parallel_attention
from .hf_config import ConfigMismatch

__all__ = ["ContextParallelAttention", "all_gather_sequence", "attend"]


class ContextParallelAttention(MegatronModule):
    """Drop-in ``core_attention`` for megatron-core's ``SelfAttention``, with context parallelism.

    megatron-core's local ``DotProductAttention`` refuses ``context_parallel_size > 1`` (only TE's
    attention has CP); this class takes its place in the ascend_patch specs (same constructor and
    forward signature, so ``SelfAttention`` builds it unchanged). It runs what the TE layer's
    ``DotProductAttention`` runs: without CP, causal (or unmasked) attention through
    :func:`ascend_patch.ops.context_parallel.attend` (``npu_fusion_attention`` BSND within its
    documented limits, else SDPA); with CP,
    :func:`ascend_patch.ops.context_parallel.context_parallel_attention` on Megatron's load-balanced
    split for every ``cp_comm_type`` megatron-core offers (``p2p``, ``all_gather``, ``a2a``, ``a2a+p2p``).
    The family specs import this module only when a spec is built.
    """

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None, model_comm_pgs: Any = None) -> None:
        super().__init__(config=config)
        # the process groups: megatron-core's SelfAttention passes them as pg_collection, or (0.13, 0.14) as
        # model_comm_pgs, a ModelCommProcessGroups with the same tp / cp / hcp fields; 0.12 passes none
        if pg_collection is None:
            pg_collection = model_comm_pgs
        if cp_comm_type not in (None, *COMM_TYPES):
            raise ConfigMismatch(f"cp_comm_type={cp_comm_type!r} is not a context-parallel exchange",
                                 "cp-comm-type", f"use one of {', '.join(COMM_TYPES)} (--cp-comm-type)")
        if config.window_size is not None:
            raise ConfigMismatch("sliding-window attention (window_size) is not supported by "
                                 "ContextParallelAttention", "window-size",
                                 "use megatron-core's local spec without CP")
        softmax_type = getattr(config, "softmax_type", "vanilla")  # a config without the field has only vanilla
        if softmax_type != "vanilla":
            raise ConfigMismatch(f"softmax_type={softmax_type!r} is not supported", "softmax-type", "use 'vanilla'")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        tp = pg_collection.tp if pg_collection is not None and hasattr(pg_collection, "tp") else \
            parallel_state.get_tensor_model_parallel_group()
        self.cp_comm_type = cp_comm_type or "p2p"
        self.cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
        if self.cp_group is None and config.context_parallel_size > 1:
            self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_ranks: list[int] | None = None
        if self.cp_group is not None and config.context_parallel_size > 1:
            import torch.distributed as dist

            self.cp_ranks = dist.get_process_group_ranks(self.cp_group)
            if self.cp_comm_type == "a2a+p2p":
                hcp = getattr(pg_collection, "hcp", None) if pg_collection is not None else None
                self.cp_group = hcp or parallel_state.get_hierarchical_context_parallel_groups()
        tp_size = tp.size()
        self.hidden_size_per_partition = divide(config.kv_channels * config.num_attention_heads, tp_size)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
        if packed_seq_params is not None or attention_bias is not None:
            raise ConfigMismatch("ContextParallelAttention does not take packed sequences or an attention bias",
                                 "attention-input", "train without packed sequences (--reset-attention-mask) "
                                 "or use megatron-core's local spec without CP")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal
        if not causal and attention_mask is not None:
            raise ConfigMismatch(f"attn_mask_type={mask_type} with an explicit attention_mask is not supported",
                                 "attention-mask", "ContextParallelAttention computes causal or unmasked attention: "
                                 "use a causal mask type")
        dropout = self.dropout if self.training else 0.0
        # [s, b, h, d] -> [b, s, h, d]
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))
        if self.cp_ranks is not None and len(self.cp_ranks) > 1:
            out = self._context_parallel(q, k, v, causal, dropout)
        else:
            out = self._attend(q, k, v, causal, dropout)
        # [b, s, np, d] -> [s, b, np * d]
        return out.transpose(0, 1).reshape(query.shape[0], query.shape[1], self.hidden_size_per_partition)

    def _context_parallel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                          dropout: float) -> torch.Tensor:
        def run() -> torch.Tensor:
            return context_parallel_attention(q, k, v, comm_type=self.cp_comm_type, group=self.cp_group,
                                              causal=causal, scale=self.softmax_scale, dropout=dropout,
                                              global_ranks=self.cp_ranks)

        if dropout > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return run()
        return run()

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout: float) -> torch.Tensor:
        if dropout > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return attend(q, k, v, causal, self.softmax_scale, dropout)
        return attend(q, k, v, causal, self.softmax_scale, dropout)
