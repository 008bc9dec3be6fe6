"""One attention block with its softmax statistics, forward and backward: the step of ring attention.

Ring attention (context parallelism, ``cp_comm_type="p2p"``) computes a query block
against key/value blocks that arrive one at a time, merges the partial outputs by their
log-sum-exp, and in the backward pass recomputes each block's gradient from the *merged*
output and log-sum-exp (flash-attention's backward). Layout (b, s, heads, d); key/value
heads divide query heads (GQA); ``causal`` is aligned to the bottom-right corner.

* npu: ``npu_fusion_attention`` (BSND; ``softmax_max`` / ``softmax_sum`` give the
  log-sum-exp) and ``npu_fusion_attention_grad`` fed the merged statistics as
  ``softmax_max = lse, softmax_sum = 1`` and the merged output as ``attention_in``; the
  kernel's dropout seed/offset/numels are kept from forward for the backward.
* cpu (and npu outside the kernels' limits): the explicit softmax in fp32; dropout masks
  come from a generator seeded per block from the device generator (so megatron's RNG
  tracker fork governs them) and are regenerated in backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .attention_npu import compressed_causal_mask, npu_supports

__all__ = ["BlockResult", "block_backward", "block_forward", "merge"]

_SEED_BOUND = 2**62


@dataclass
class BlockResult:
    """A block's output (b, sq, h, d), log-sum-exp (b, h, sq, fp32) and what its backward needs."""

    out: Tensor
    lse: Tensor
    state: Any = None  # cpu: the dropout seed; npu: (seed, offset, numels)


def _kernels(kernels: Any, q: Tensor, k: Tensor) -> tuple[Any, Any]:
    if kernels is None or not npu_supports(q, k):
        return None, None
    return kernels.get("npu_fusion_attention"), kernels.get("npu_fusion_attention_grad")


def _scores(q: Tensor, k: Tensor, causal: bool, scale: float) -> Tensor:
    """fp32 scores (b, h, sq, sk), masked bottom-right causal where asked."""
    rep = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(rep, dim=2) if rep > 1 else k
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk.float()) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _dropout_mask(shape: torch.Size, dropout: float, seed: int, device: torch.device) -> Tensor:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return (torch.rand(shape, generator=gen, device=device) >= dropout).float() / (1.0 - dropout)


def _expand_heads(x: Tensor, heads: int) -> Tensor:
    rep = heads // x.shape[2]
    return x.repeat_interleave(rep, dim=2) if rep > 1 else x


def _fold_heads(grad: Tensor, groups: int) -> Tensor:
    b, s, h, d = grad.shape
    return grad.view(b, s, groups, h // groups, d).sum(3) if h != groups else grad


def block_forward(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, dropout: float = 0.0,
                  kernels: Any = None) -> BlockResult:
    """Attention of q (b, sq, h, d) over k, v (b, sk, g, d) with its log-sum-exp; no autograd graph."""
    fwd, bwd = _kernels(kernels, q, k)
    if fwd is not None and bwd is not None:
        mask = compressed_causal_mask(q.device) if causal else None
        res = fwd(q.contiguous(), k.contiguous(), v.contiguous(), q.shape[2], "BSND", atten_mask=mask, scale=scale,
                  keep_prob=1.0 - dropout, sparse_mode=3 if causal else 0)
        smax, ssum = res[1][..., 0].float(), res[2][..., 0].float()
        return BlockResult(res[0], smax + torch.log(ssum), (res[4], res[5], res[6]))
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    seed = None
    if dropout > 0.0:
        seed = int(torch.randint(0, _SEED_BOUND, (1,), device=q.device).item())
        p = p * _dropout_mask(p.shape, dropout, seed, q.device)
    out = torch.einsum("bhqk,bkhd->bqhd", p, _expand_heads(v, q.shape[2]).float())
    return BlockResult(out, lse, seed)


def block_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, *, causal: bool,
                   scale: float, dropout: float = 0.0, state: Any = None,
                   kernels: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the block given the *merged* output, its gradient and log-sum-exp (fp32 on cpu)."""
    fwd, bwd = _kernels(kernels, q, k)
    if fwd is not None and bwd is not None:
        mask = compressed_causal_mask(q.device) if causal else None
        stat = lse.unsqueeze(-1).expand(*lse.shape, 8).contiguous()
        seed, offset, numels = state if state is not None else (0, 0, 0)
        res = bwd(q.contiguous(), k.contiguous(), v.contiguous(), dout.to(q.dtype).contiguous(), q.shape[2], "BSND",
                  atten_mask=mask, softmax_max=stat, softmax_sum=torch.ones_like(stat),
                  attention_in=out.to(q.dtype).contiguous(), scale_value=scale, keep_prob=1.0 - dropout, seed=seed,
                  offset=offset, numels=numels, sparse_mode=3 if causal else 0)
        return res[0], res[1], res[2]
    heads, groups = q.shape[2], k.shape[2]
    s = _scores(q, k, causal, scale)
    p = torch.exp(s - lse.unsqueeze(-1))
    do = dout.float()
    vv = _expand_heads(v, heads).float()
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
    if dropout > 0.0:
        m = _dropout_mask(p.shape, dropout, state, q.device)
        dv = torch.einsum("bhqk,bqhd->bkhd", p * m, do)
        dp = dp * m
    else:
        dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    delta = (do * out.float()).sum(-1).transpose(1, 2)  # (b, h, sq)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, _expand_heads(k, heads).float()) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale
    return dq, _fold_heads(dk, groups), _fold_heads(dv, groups)


def merge(acc_out: Tensor | None, acc_lse: Tensor | None, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """Merge a block's (out, lse) into the running (fp32) ones: softmax over the union of their keys."""
    out = out.float()
    if acc_out is None or acc_lse is None:
        return out, lse
    new = torch.logaddexp(acc_lse, lse)
    w_old = torch.exp(acc_lse - new).transpose(1, 2).unsqueeze(-1)  # (b, sq, h, 1)
    w_new = torch.exp(lse - new).transpose(1, 2).unsqueeze(-1)
    return acc_out * w_old + out * w_new, new
