"""``transformer_engine.pytorch.DotProductAttention`` on the target, with context parallelism."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ....ops.attention import attention_bshd, attention_varlen, sdpa_bhsd
from ._common import TEModule, refuse, tp_size_of
from .fp8 import fp8_unavailable

__all__ = ["DotProductAttention", "MASK_TYPES"]

MASK_TYPES = ("no_mask", "causal", "causal_bottom_right", "padding", "padding_causal",
              "padding_causal_bottom_right", "arbitrary")


def _group_size(group: Any) -> int:
    if group is None:
        return 1
    if isinstance(group, (list, tuple)):
        return math.prod(_group_size(g) for g in group)
    return torch.distributed.get_world_size(group)


class DotProductAttention(TEModule):
    """TE's ``DotProductAttention``.

    TE's semantics as megatron-core's ``TEDotProductAttention`` uses them: q (sq, b, h, d),
    k/v (sk, b, g, d) in ``qkv_format="sbhd"`` (or "bshd", or packed "thd" with
    ``cu_seqlens_q/kv``); GQA when ``num_gqa_groups`` < heads; output (sq, b, h * d_v).
    Heads and groups are divided by the TP size. Mask types:

    * ``causal`` (top-left aligned, TE's meaning; megatron's self-attention has sq == sk),
      ``causal_bottom_right``, ``no_mask``: the ``attention_mask`` argument is ignored, as in TE;
    * ``padding*`` with ``thd``: per-sequence attention from ``cu_seqlens``;
    * ``arbitrary`` / ``padding*`` with a mask tensor (True = masked out): SDPA with that mask;
    * ``window_size=(left, right)``: the band, bottom-right aligned like flash-attention's.

    Kernels: :func:`ascend_patch.ops.attention.attention_bshd` / ``attention_varlen``
    (``npu_fusion_attention`` BSND / TND on npu within its limits, else SDPA). Dropout runs
    inside ``get_rng_state_tracker().fork()`` unless ``sequence_parallel`` (TE's rule, also
    megatron's local attention's).

    Context parallelism (``cp_group`` of size > 1, set at construction or by
    ``set_context_parallel_group``): :func:`ascend_patch.ops.context_parallel.context_parallel_attention`
    for ``cp_comm_type`` p2p, all_gather, a2a and a2a+p2p, causal or no mask, sbhd/bshd.

    Refused with an error naming the option: attention bias, ALiBi, ``softmax_type`` other
    than vanilla, ``return_max_logit``, inference KV caches, FP8 output, top-left ``causal``
    with sq != sk, and under CP: packed sequences, sliding windows, explicit masks.
    """

    def __init__(self, num_attention_heads: int, kv_channels: int | tuple[int, int], num_gqa_groups: int | None = None,
                 attention_dropout: float = 0.0, qkv_format: str = "sbhd", attn_mask_type: str = "causal",
                 window_size: tuple[int, int] | None = None, sequence_parallel: bool = False, tp_size: int = 1,
                 get_rng_state_tracker: Callable[[], Any] | None = None, tp_group: Any = None,
                 layer_number: int | None = None, attention_type: str = "self", cp_group: Any = None,
                 cp_global_ranks: list[int] | None = None, cp_stream: Any = None, cp_comm_type: str = "p2p",
                 softmax_scale: float | None = None, softmax_type: str = "vanilla",
                 return_max_logit: bool = False) -> None:
        super().__init__()
        if softmax_type != "vanilla":
            raise refuse("DotProductAttention", f"softmax_type={softmax_type!r}", "only the standard softmax is "
                         "implemented", "use softmax_type='vanilla' (drop --softmax-type)")
        if return_max_logit:
            raise refuse("DotProductAttention", "return_max_logit=True", "the attention kernels do not report the "
                         "maximum logit", "drop --qk-clip / --log-max-attention-logit")
        self.tp_size = tp_size_of(tp_group, tp_size)
        groups = num_gqa_groups if num_gqa_groups is not None else num_attention_heads
        if num_attention_heads % groups:
            raise ValueError(f"transformer_engine.pytorch.DotProductAttention: num_attention_heads="
                             f"{num_attention_heads} is not a multiple of num_gqa_groups={groups}")
        for label, count in (("num_attention_heads", num_attention_heads), ("num_gqa_groups", groups)):
            if count % self.tp_size:
                raise ValueError(f"transformer_engine.pytorch.DotProductAttention: {label}={count} is not divisible "
                                 f"by the tensor-parallel size {self.tp_size}")
        self.num_attention_heads, self.num_gqa_groups = num_attention_heads, groups
        self.num_attention_heads_per_partition = num_attention_heads // self.tp_size
        self.num_gqa_groups_per_partition = groups // self.tp_size
        k_ch, v_ch = kv_channels if isinstance(kv_channels, tuple) else (kv_channels, kv_channels)
        self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v = k_ch, v_ch
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(k_ch)
        self.attention_dropout = attention_dropout
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type.replace(",", "_")
        self.window_size = window_size
        self.attention_type = attention_type
        self.layer_number = layer_number
        self.tp_group = tp_group
        self.sequence_parallel = sequence_parallel
        self.get_rng_state_tracker = get_rng_state_tracker
        self._dropout_ctx: Callable[[], Any] = contextlib.nullcontext
        if get_rng_state_tracker is not None and not sequence_parallel and attention_dropout > 0:
            self._dropout_ctx = lambda: get_rng_state_tracker().fork()
        self.cp_group: Any = None
        self.cp_global_ranks: list[int] | None = None
        self.cp_comm_type = cp_comm_type
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def set_context_parallel_group(self, cp_group: Any, cp_global_ranks: list[int] | None, cp_stream: Any,
                                   cp_comm_type: str = "p2p") -> None:
        """TE's hook: the CP group (a pair [a2a, p2p] for ``a2a+p2p``), its global ranks, the comm type."""
        from ....ops.context_parallel import COMM_TYPES

        comm = cp_comm_type or "p2p"
        if comm not in COMM_TYPES:
            raise ValueError(f"transformer_engine.pytorch.DotProductAttention: cp_comm_type={comm!r} is not one of "
                             f"{', '.join(COMM_TYPES)} (--cp-comm-type)")
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (cp_group, cp_global_ranks,
                                                                                   cp_stream, comm)

    def forward(self, query_layer: Tensor, key_layer: Tensor, value_layer: Tensor, attention_mask: Any = None,
                qkv_format: str | None = None, cu_seqlens_q: Tensor | None = None,
                cu_seqlens_kv: Tensor | None = None, cu_seqlens_q_padded: Tensor | None = None,
                cu_seqlens_kv_padded: Tensor | None = None, max_seqlen_q: int | None = None,
                max_seqlen_kv: int | None = None, attn_mask_type: str | None = None,
                window_size: tuple[int, int] | None = None, checkpoint_core_attention: bool = False,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Tensor | None = None,
                alibi_slopes: Tensor | None = None, fast_zero_fill: bool = True, inference_params: Any = None,
                pad_between_seqs: bool | None = None, fp8_output: bool = False,
                num_splits: int | None = None) -> Tensor:
        if core_attention_bias_type != "no_bias" or core_attention_bias is not None:
            raise refuse("DotProductAttention", f"core_attention_bias_type={core_attention_bias_type!r}",
                         "attention bias is not implemented", "use position embeddings without attention bias "
                         "(e.g. --position-embedding-type rope)")
        if alibi_slopes is not None:
            raise refuse("DotProductAttention", "alibi_slopes=...", "ALiBi is not implemented", "use RoPE")
        if inference_params is not None:
            raise refuse("DotProductAttention", "inference_params=...", "TE's KV cache is not implemented",
                         "let megatron-core manage the KV cache (its inference path does)")
        if fp8_output:
            raise fp8_unavailable("transformer_engine.pytorch.DotProductAttention(fp8_output=True)")
        fmt = qkv_format or self.qkv_format
        mask_type = (attn_mask_type or self.attn_mask_type).replace(",", "_")
        if mask_type == "causal_padding":
            mask_type = "padding_causal"
        if mask_type not in MASK_TYPES:
            raise ValueError(f"transformer_engine.pytorch.DotProductAttention: attn_mask_type={mask_type!r} is not "
                             f"one of {', '.join(MASK_TYPES)}")
        window = window_size if window_size is not None else self.window_size
        args = (query_layer, key_layer, value_layer, attention_mask, fmt, mask_type, window, cu_seqlens_q,
                cu_seqlens_kv)
        if checkpoint_core_attention and self.training:
            import torch.utils.checkpoint

            return torch.utils.checkpoint.checkpoint(self._attention, *args, use_reentrant=False)
        return self._attention(*args)

    # -- the computation --------------------------------------------------------------------

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Any, fmt: str, mask_type: str,
                   window: tuple[int, int] | None, cu_q: Tensor | None, cu_kv: Tensor | None) -> Tensor:
        dropout = self.attention_dropout if self.training else 0.0
        with self._dropout_ctx() if dropout > 0 else contextlib.nullcontext():
            if fmt == "thd":
                return self._packed(q, k, v, mask_type, window, cu_q, cu_kv, dropout)
            if fmt not in ("sbhd", "bshd"):
                raise ValueError(f"transformer_engine.pytorch.DotProductAttention: qkv_format={fmt!r} is not one of "
                                 "sbhd, bshd, thd")
            if fmt == "sbhd":
                q, k, v = (t.transpose(0, 1) for t in (q, k, v))
            out = self._batched(q, k, v, mask, mask_type, window, dropout)  # (b, s, h, d)
            out = out.reshape(out.shape[0], out.shape[1], -1)
            return out.transpose(0, 1).contiguous() if fmt == "sbhd" else out

    def _band(self, mask_type: str, window: tuple[int, int] | None, sq: int, sk: int) -> tuple[int, int]:
        left, right = (int(window[0]), int(window[1])) if window is not None else (-1, -1)
        if "causal" in mask_type:
            if "bottom_right" not in mask_type and sq != sk:
                raise refuse("DotProductAttention", f"attn_mask_type={mask_type!r} with {sq} queries and {sk} keys",
                             "top-left causal masks are implemented for self-attention (sq == sk) only",
                             "use attn_mask_type='causal_bottom_right'")
            right = 0
        return left, right

    def _batched(self, q: Tensor, k: Tensor, v: Tensor, mask: Any, mask_type: str, window: tuple[int, int] | None,
                 dropout: float) -> Tensor:
        cp = _group_size(self.cp_group)
        explicit = mask_type == "arbitrary" or (mask_type.startswith("padding") and mask is not None)
        if cp > 1:
            if explicit or window is not None and tuple(window) != (-1, -1) and tuple(window) != (-1, 0):
                raise refuse("DotProductAttention", f"context parallelism with attn_mask_type={mask_type!r}, "
                             f"window_size={window}", "context-parallel attention is causal or unmasked",
                             "use a causal or no mask without a sliding window, or --context-parallel-size 1")
            from ....ops.context_parallel import context_parallel_attention

            return context_parallel_attention(q, k, v, comm_type=self.cp_comm_type, group=self.cp_group,
                                              causal="causal" in mask_type, scale=self.softmax_scale,
                                              dropout=dropout, global_ranks=self.cp_global_ranks)
        if explicit:
            return self._masked(q, k, v, mask, mask_type, dropout)
        left, right = self._band(mask_type, window, q.shape[1], k.shape[1])
        out, _ = attention_bshd(q, k, v, dropout_p=dropout, scale=self.softmax_scale, left=left, right=right,
                                api="DotProductAttention")
        return out

    def _masked(self, q: Tensor, k: Tensor, v: Tensor, mask: Any, mask_type: str, dropout: float) -> Tensor:
        """SDPA with TE's masks (True = masked out): one (b|1, h|1, sq, sk) tensor, or (q, kv) padding masks."""
        sq, sk = q.shape[1], k.shape[1]
        if isinstance(mask, (tuple, list)):
            q_mask, kv_mask = mask
            masked = q_mask.reshape(q_mask.shape[0], 1, sq, 1) | kv_mask.reshape(kv_mask.shape[0], 1, 1, sk)
        else:
            masked = mask.bool()
        keep = ~masked
        if "causal" in mask_type:
            shift = sk - sq if "bottom_right" in mask_type else 0
            keep = keep & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=shift)
        out, _ = sdpa_bhsd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout,
                           scale=self.softmax_scale, keep=keep, causal_fast=False, want_lse=False)
        return out.transpose(1, 2)

    def _packed(self, q: Tensor, k: Tensor, v: Tensor, mask_type: str, window: tuple[int, int] | None,
                cu_q: Tensor | None, cu_kv: Tensor | None, dropout: float) -> Tensor:
        if cu_q is None or cu_kv is None:
            raise ValueError("transformer_engine.pytorch.DotProductAttention: qkv_format='thd' needs cu_seqlens_q "
                             "and cu_seqlens_kv")
        if _group_size(self.cp_group) > 1:
            raise refuse("DotProductAttention", "qkv_format='thd' with context parallelism", "packed sequences are "
                         "not split over CP ranks here", "use --context-parallel-size 1 with packed sequences")
        left, right = (int(window[0]), int(window[1])) if window is not None else (-1, -1)
        if "causal" in mask_type:
            right = 0  # per sequence, every packed sequence has as many queries as keys
        out, _ = attention_varlen(q, k, v, cu_q, cu_kv, dropout_p=dropout, scale=self.softmax_scale, left=left,
                                  right=right, api="DotProductAttention")
        return out.reshape(out.shape[0], -1)
