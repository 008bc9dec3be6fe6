"""Core attention for megatron-core layer specs, with context parallelism and no Transformer Engine.

megatron-core's local ``DotProductAttention`` refuses ``context_parallel_size > 1``
(only TE's attention has CP). :class:`ContextParallelAttention` takes its place in the
ascend_patch specs (same constructor and forward signature, so ``SelfAttention`` builds
it unchanged):

* the sequence arrives split the way Megatron splits it (``get_batch_on_this_cp_rank``):
  2 x CP chunks, rank r holding chunks r and 2CP-1-r, which balances causal work;
* K and V are all-gathered across the CP group (Transformer Engine's ``all_gather``
  CP mode; ``cp_comm_type="p2p"`` is served the same way: same result, other
  communication) and put back in sequence order; the backward reduce-scatters their
  gradients;
* each local query chunk with global index g attends keys ``[0, (g+1) * chunk)`` with
  a causal mask aligned to the bottom right (its own chunk is the diagonal block);
* the block attention is ``torch_npu.npu_fusion_attention`` when the target's kernel
  table has it and the shapes are within its documented limits (the ops' one check,
  :func:`ascend_patch.ops.attention_npu.npu_supports`: at most 256 query heads, head dim
  at most 768, query heads a multiple of key/value heads, fp16/bf16/fp32); BSND layout,
  ``sparse_mode=3`` with the compressed 2048x2048 mask, GQA native. Otherwise, as in the
  ops, ``scaled_dot_product_attention``.

Without CP (size 1) it is plain causal (or unmasked) attention through the same kernels.
This module imports megatron-core; the family specs import it only when a spec is built.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

from ..backend import active_backend
from ..ops.attention_npu import compressed_causal_mask, npu_supports

__all__ = ["ContextParallelAttention", "all_gather_sequence", "attend"]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; the backward reduce-scatters (sums) the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group = group
        world = dist.get_world_size(group)
        out = torch.empty((world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        world = dist.get_world_size(ctx.group)
        out = torch.empty((grad.shape[0] // world, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_gather_sequence(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """``tensor`` [s_local, ...] gathered over ``group`` and put back in global sequence order.

    Rank r holds chunks (r, 2W-1-r) of the 2W chunks; the result is chunks 0..2W-1.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    gathered = _GatherSequence.apply(tensor, group)
    chunks = gathered.chunk(2 * world, dim=0)  # rank-major: r0c0, r0c1, r1c0, r1c1, ...
    order = [0] * (2 * world)
    for rank in range(world):
        order[rank] = chunks[2 * rank]
        order[2 * world - 1 - rank] = chunks[2 * rank + 1]
    return torch.cat(order, dim=0)


def _npu_attend(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float, dropout: float) -> torch.Tensor:
    # q [b, sq, np, d], k/v [b, sk, ng, d] (BSND); rightDownCausal = bottom-right aligned
    mask = compressed_causal_mask(q.device) if causal else None
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = kernel(q, k, v, q.shape[2], "BSND", atten_mask=mask, scale=scale, keep_prob=1.0 - dropout,
                 sparse_mode=3 if causal else 0)
    return out[0]


def _torch_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  dropout: float) -> torch.Tensor:
    # SDPA wants [b, heads, s, d]; its is_causal is top-left aligned, so give the mask itself
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    mask = None
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
           dropout: float = 0.0, kernels: Any = None) -> torch.Tensor:
    """Attention of q [b, sq, np, d] over k, v [b, sk, ng, d]; causal is bottom-right aligned.

    On ``npu_fusion_attention`` where ``kernels`` has it and the shapes are within its limits, else SDPA.
    """
    kernel = kernels.get("npu_fusion_attention") if kernels is not None else None
    if kernel is not None and npu_supports(q, k):
        return _npu_attend(kernel, q, k, v, causal, scale, dropout)
    return _torch_attend(q, k, v, causal, scale, dropout)


class ContextParallelAttention(MegatronModule):
    """Drop-in ``core_attention`` for megatron-core's ``SelfAttention`` (see the module docstring)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        super().__init__(config=config)
        if cp_comm_type not in (None, "all_gather", "p2p"):
            # p2p (Megatron's default) is served by the all-gather: same result, other communication
            raise ValueError(f"cp_comm_type={cp_comm_type!r} is not supported by ContextParallelAttention, "
                             "which exchanges K/V with an all-gather; use 'all_gather' or 'p2p'")
        if config.window_size is not None:
            raise ValueError("sliding-window attention (window_size) is not supported by "
                             "ContextParallelAttention; use megatron-core's local spec without CP")
        if config.softmax_type != "vanilla":
            raise ValueError(f"softmax_type={config.softmax_type!r} is not supported; use 'vanilla'")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        tp = pg_collection.tp if pg_collection is not None and hasattr(pg_collection, "tp") else \
            parallel_state.get_tensor_model_parallel_group()
        self.cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
        if self.cp_group is None and config.context_parallel_size > 1:
            self.cp_group = parallel_state.get_context_parallel_group()
        tp_size = tp.size()
        self.hidden_size_per_partition = divide(config.kv_channels * config.num_attention_heads, tp_size)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.backend = active_backend()  # kernels are looked up per call (tests override them)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("ContextParallelAttention does not take packed sequences or an attention bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal
        if not causal and attention_mask is not None:
            raise ValueError(f"attn_mask_type={mask_type} with an explicit attention_mask is not supported; "
                             "ContextParallelAttention computes causal or unmasked attention")
        kernels = self.backend.kernels if self.backend is not None else None
        dropout = self.dropout if self.training else 0.0
        # [s, b, h, d] -> [b, s, h, d]
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))
        cp = self.cp_group.size() if self.cp_group is not None else 1
        if cp == 1:
            out = self._attend(q, k, v, causal, dropout, kernels)
        else:
            k = all_gather_sequence(key, self.cp_group).transpose(0, 1)
            v = all_gather_sequence(value, self.cp_group).transpose(0, 1)
            rank = self.cp_group.rank()
            chunk = q.shape[1] // 2
            parts = []
            for local, index in ((0, rank), (1, 2 * cp - 1 - rank)):
                end = (index + 1) * chunk if causal else k.shape[1]
                parts.append(self._attend(q[:, local * chunk:(local + 1) * chunk], k[:, :end], v[:, :end],
                                          causal, dropout, kernels))
            out = torch.cat(parts, dim=1)
        # [b, s, np, d] -> [s, b, np * d]
        return out.transpose(0, 1).reshape(query.shape[0], query.shape[1], self.hidden_size_per_partition)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout: float,
                kernels: Any) -> torch.Tensor:
        if dropout > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return attend(q, k, v, causal, self.softmax_scale, dropout, kernels)
        return attend(q, k, v, causal, self.softmax_scale, dropout, kernels)
