"""flash-attn 2 calls translated to ``torch_npu.npu_fusion_attention`` (its documented API).

Translation (flash-attn semantics on the left):

* layout (b, s, h, d) -> ``input_layout="BSND"``; packed varlen (total, h, d) -> ``"TND"``
  with ``actual_seq_qlen`` / ``actual_seq_kvlen`` = the cumulative lengths *without* the
  leading 0 (cu_seqlens [0, 2, 5] -> [2, 5]);
* ``softmax_scale`` -> ``scale`` (default 1/sqrt(d)); ``dropout_p`` -> ``keep_prob = 1 - p``;
  ``head_num`` = query heads (GQA/MQA: key/value heads divide them, passed as they are);
* no mask -> ``atten_mask=None, sparse_mode=0``;
* ``causal`` (bottom-right aligned when sq != sk) -> ``sparse_mode=3`` (rightDownCausal) with
  the compressed 2048x2048 mask ``triu(ones, 1)``, True = masked out;
* ``window_size=(left, right)`` (and causal with a left window) -> ``sparse_mode=4`` (band,
  whose origin the documentation puts at the bottom-right corner, like flash-attn's window)
  with ``pre_tockens=left``, ``next_tockens=right`` (0 when causal, 2147483647 for -1) and
  the same compressed mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["INF_TOKENS", "SparseArgs", "compressed_causal_mask", "fusion_attention_bsnd",
           "fusion_attention_tnd", "npu_supports", "sparse_args"]

INF_TOKENS = 2147483647
NPU_MAX_HEADS = 256
NPU_MAX_HEAD_DIM = 768
_COMPRESSED: dict[str, Tensor] = {}


def compressed_causal_mask(device: torch.device) -> Tensor:
    """The 2048x2048 ``triu(ones, 1)`` bool mask sparse modes 2, 3 and 4 expect (cached per device)."""
    key = str(device)
    mask = _COMPRESSED.get(key)
    if mask is None:
        mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=device), diagonal=1)
        _COMPRESSED[key] = mask
    return mask


@dataclass(frozen=True)
class SparseArgs:
    """The mask arguments of one npu_fusion_attention call."""

    atten_mask: Tensor | None
    sparse_mode: int
    pre_tockens: int
    next_tockens: int


def sparse_args(left: int, right: int, device: torch.device) -> SparseArgs:
    """flash-attn's window (``-1`` = unbounded; causal is ``right=0``) as npu mask arguments."""
    if left < 0 and right < 0:
        return SparseArgs(None, 0, INF_TOKENS, INF_TOKENS)
    mask = compressed_causal_mask(device)
    if left < 0 and right == 0:
        return SparseArgs(mask, 3, INF_TOKENS, 0)
    return SparseArgs(mask, 4, left if left >= 0 else INF_TOKENS, right if right >= 0 else INF_TOKENS)


def npu_supports(q: Tensor, k: Tensor) -> bool:
    """Whether npu_fusion_attention's documented limits allow these query/key tensors."""
    heads, kv_heads, d = q.shape[-2], k.shape[-2], q.shape[-1]
    return (heads <= NPU_MAX_HEADS and d <= NPU_MAX_HEAD_DIM and heads % kv_heads == 0
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32))


def fusion_attention_bsnd(kernel: Any, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, scale: float,
                          left: int, right: int, want_lse: bool) -> tuple[Tensor, Tensor | None]:
    """(out (b, sq, h, d), logsumexp (b, h, sq) or None) for batched inputs."""
    args = sparse_args(left, right, q.device)
    res = kernel(q, k, v, q.shape[2], "BSND", atten_mask=args.atten_mask, scale=scale, keep_prob=1.0 - dropout_p,
                 pre_tockens=args.pre_tockens, next_tockens=args.next_tockens, sparse_mode=args.sparse_mode)
    lse = None
    if want_lse:
        # softmax_max / softmax_sum are (b, n, sq, 8), the value repeated on the last dim
        smax, ssum = res[1][..., 0].float(), res[2][..., 0].float()
        lse = torch.where(ssum > 0, smax + torch.log(ssum), torch.full_like(smax, float("inf")))
    return res[0], lse


def fusion_attention_tnd(kernel: Any, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         *, dropout_p: float, scale: float, left: int, right: int) -> Tensor:
    """Packed (total, h, d) attention with per-sequence masks."""
    args = sparse_args(left, right, q.device)
    res = kernel(q, k, v, q.shape[1], "TND", atten_mask=args.atten_mask, scale=scale, keep_prob=1.0 - dropout_p,
                 pre_tockens=args.pre_tockens, next_tockens=args.next_tockens, sparse_mode=args.sparse_mode,
                 actual_seq_qlen=[int(n) for n in cu_seqlens_q[1:].tolist()],
                 actual_seq_kvlen=[int(n) for n in cu_seqlens_k[1:].tolist()])
    return res[0]
