"""flash-attn 2's API on the target: same layouts, options and return values (see :func:`flash_attn_func`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ..backend import current_target
from ..unsupported import UnsupportedOption
from .attention_npu import fusion_attention_bsnd, fusion_attention_tnd, npu_supports

__all__ = [
    "attention_bshd",
    "attention_varlen",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "keep_mask",
]


def _refuse(api: str, option: str, instead: str) -> UnsupportedOption:
    return UnsupportedOption(f"flash_attn.{api}({option}) is not supported by ascend_patch's adaptor; {instead}")


def _options(api: str, q: Tensor, dropout_p: float, softmax_scale: float | None, causal: bool,
             window_size: tuple[int, int], softcap: float, alibi_slopes: Tensor | None,
             return_attn_probs: bool) -> tuple[float, int, int]:
    """(scale, left, right), refusing what neither path computes: ``softcap``, ``alibi_slopes``, and
    ``return_attn_probs`` with dropout (the dropout-encoded ``S_dmask`` cannot be reproduced)."""
    if softcap:
        raise _refuse(api, f"softcap={softcap}", "npu_fusion_attention has no soft-capping; use softcap=0.0 or "
                      "apply tanh capping to explicit scores")
    if alibi_slopes is not None:
        raise _refuse(api, "alibi_slopes=...", "add the ALiBi bias to an explicit attn_mask and call "
                      "torch.nn.functional.scaled_dot_product_attention")
    if return_attn_probs and dropout_p > 0:
        raise _refuse(api, f"return_attn_probs=True, dropout_p={dropout_p}", "the dropout-encoded S_dmask cannot be "
                      "reproduced; use dropout_p=0.0 to get (out, softmax_lse, None)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attn.{api}: dropout_p must be in [0, 1), got {dropout_p}")
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0
    return scale, left, right


def _npu_determinism(api: str, deterministic: bool) -> None:
    """Called where ``npu_fusion_attention`` will run: ``deterministic=True`` needs torch_npu's deterministic mode.

    flash-attn's ``deterministic`` asks for a deterministic backward. The cpu paths (SDPA and the
    per-sequence loop) are deterministic whatever it says: the same inputs give bitwise the same
    dq/dk/dv (tests/ops/test_ops_attention.py). ``npu_fusion_attention`` has no such argument:
    torch_npu makes its backward (aclnnFlashAttentionScoreGrad) deterministic in its deterministic
    mode, ``torch.use_deterministic_algorithms(True)``, which it honours only once per thread, so
    the adaptor does not toggle it per call and warns instead.
    """
    if deterministic and not torch.are_deterministic_algorithms_enabled():
        import warnings

        warnings.warn(f"flash_attn.{api}(deterministic=True): npu_fusion_attention has no deterministic flag; its "
                      "backward is deterministic in torch_npu's deterministic mode only: call "
                      "torch.use_deterministic_algorithms(True) once at start-up (torch_npu honours the first "
                      "setting per thread, so ascend_patch does not switch it per call)", stacklevel=4)


def _check_heads(api: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"flash_attn.{api}: k and v must agree except in head dim, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    h, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or h % hk:
        raise ValueError(f"flash_attn.{api}: the number of query heads ({h}) must be a multiple of the number of "
                         f"key/value heads ({hk})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"flash_attn.{api}: q and k head dims differ ({q.shape[-1]} vs {k.shape[-1]})")


def keep_mask(sq: int, sk: int, left: int, right: int, device: torch.device | str = "cpu",
              lengths_k: Tensor | None = None) -> Tensor | None:
    """Bool (sq, sk) - or (b, sq, sk) with per-row key lengths - True where query i may see key j.

    flash-attn's band aligned to the bottom-right corner; None when every key is visible.
    """
    if left < 0 and right < 0 and lengths_k is None:
        return None
    j = torch.arange(sk, device=device)
    i = torch.arange(sq, device=device).unsqueeze(1)
    if lengths_k is None:
        diag = i + (sk - sq)
        keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    else:
        lk = lengths_k.to(device).long().view(-1, 1, 1)
        diag = i.unsqueeze(0) + (lk - sq)
        keep = j < lk
    if left >= 0:
        keep = keep & (j >= diag - left)
    if right >= 0:
        keep = keep & (j <= diag + right)
    return keep


def _explicit_lse(q: Tensor, k: Tensor, scale: float, keep: Tensor | None) -> Tensor:
    """logsumexp of the scaled scores per (b, h, query), +inf where no key is visible (flash-attn's value)."""
    rep = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    scores = torch.matmul(q.float(), kk.float().transpose(-1, -2)) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def sdpa_bhsd(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, scale: float, keep: Tensor | None,
              causal_fast: bool, want_lse: bool) -> tuple[Tensor, Tensor | None]:
    """SDPA on (b, h, s, d) views; ``keep`` broadcasts to (b, h, sq, sk)."""
    gqa = q.shape[1] != k.shape[1]
    empty = None
    mask = keep
    if keep is not None:
        empty = ~keep.any(-1, keepdim=True)
        if bool(empty.any()):
            # give empty rows every key so SDPA stays finite (no NaN leaks into the backward),
            # then zero them as flash-attn does
            mask = keep | empty
        else:
            empty = None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal_fast,
                                         scale=scale, enable_gqa=gqa)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    lse = None
    if want_lse:
        if causal_fast:
            keep = keep_mask(q.shape[2], k.shape[2], -1, 0, q.device)
        lse = _explicit_lse(q, k, scale, keep)
    return out, lse


def _sdpa_bshd(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, scale: float, left: int, right: int,
               want_lse: bool) -> tuple[Tensor, Tensor | None]:
    sq, sk = q.shape[1], k.shape[1]
    causal_fast = left < 0 and right == 0 and sq == sk
    keep = None if causal_fast else keep_mask(sq, sk, left, right, q.device)
    out, lse = sdpa_bhsd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, scale=scale,
                         keep=keep, causal_fast=causal_fast, want_lse=want_lse)
    return out.transpose(1, 2).contiguous(), lse


def attention_bshd(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float = 0.0, scale: float | None = None,
                   left: int = -1, right: int = -1, want_lse: bool = False,
                   deterministic: bool = False, api: str = "flash_attn_func") -> tuple[Tensor, Tensor | None]:
    """Batched attention in flash-attn's layout with a bottom-right aligned band; (out, lse or None).

    npu: :mod:`.attention_npu` (``npu_fusion_attention`` BSND) within the kernel's limits; otherwise
    ``scaled_dot_product_attention``, the band as a boolean mask where ``is_causal`` (top-left
    aligned) cannot express it.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kernel = current_target().kernels.get("npu_fusion_attention")
    if kernel is not None and npu_supports(q, k):
        _npu_determinism(api, deterministic)
        return fusion_attention_bsnd(kernel, q, k, v, dropout_p=dropout_p, scale=scale, left=left, right=right,
                                     want_lse=want_lse)
    return _sdpa_bshd(q, k, v, dropout_p=dropout_p, scale=scale, left=left, right=right, want_lse=want_lse)


def _check_cu(api: str, name: str, cu: Tensor, total: int) -> None:
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"flash_attn.{api}: {name} must be 1-D (batch_size + 1,), got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"flash_attn.{api}: {name} must be int32, got {cu.dtype}")
    first, last = int(cu[0]), int(cu[-1])
    if first != 0 or last != total:
        raise ValueError(f"flash_attn.{api}: {name} must start at 0 and end at the token count {total}, "
                         f"got {first} .. {last}")


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, *,
                     dropout_p: float = 0.0, scale: float | None = None, left: int = -1, right: int = -1,
                     want_lse: bool = False, deterministic: bool = False,
                     api: str = "flash_attn_varlen_func") -> tuple[Tensor, Tensor | None]:
    """Packed attention, each sequence on its own; (out (total_q, h, d), lse (h, total_q) or None)."""
    return _attention_varlen(current_target().kernels.get("npu_fusion_attention"), q, k, v, cu_seqlens_q,
                             cu_seqlens_k, dropout_p=dropout_p, scale=scale, left=left, right=right,
                             want_lse=want_lse, deterministic=deterministic, api=api)


def _attention_varlen(kernel: Any, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, *,
                      dropout_p: float, scale: float | None, left: int, right: int, want_lse: bool,
                      deterministic: bool, api: str) -> tuple[Tensor, Tensor | None]:
    _check_cu(api, "cu_seqlens_q", cu_seqlens_q, q.shape[0])
    _check_cu(api, "cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"flash_attn.{api}: cu_seqlens_q and cu_seqlens_k describe different batch sizes "
                         f"({cu_seqlens_q.numel() - 1} vs {cu_seqlens_k.numel() - 1})")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if kernel is not None and npu_supports(q, k):
        if want_lse:
            raise _refuse(api, "return_attn_probs=True", "on npu the TND softmax statistics are not exposed in a "
                          "documented layout; pad to (b, s, h, d) and use flash_attn_func")
        _npu_determinism(api, deterministic)
        out = fusion_attention_tnd(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p=dropout_p, scale=scale,
                                   left=left, right=right)
        return out, None
    bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for i in range(len(bq) - 1):
        qi = q[bq[i]:bq[i + 1]].unsqueeze(0)
        ki, vi = k[bk[i]:bk[i + 1]].unsqueeze(0), v[bk[i]:bk[i + 1]].unsqueeze(0)
        if qi.shape[1] == 0:
            continue
        if ki.shape[1] == 0:  # no keys at all: zeros, lse +inf
            outs.append(torch.zeros_like(qi[0]))
            lses.append(torch.full((q.shape[1], qi.shape[1]), float("inf"), device=q.device))
            continue
        o, lse = _sdpa_bshd(qi, ki, vi, dropout_p=dropout_p, scale=scale, left=left, right=right, want_lse=want_lse)
        outs.append(o[0])
        if lse is not None:
            lses.append(lse[0])
    out = torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)
    return out, (torch.cat(lses, dim=1) if want_lse else None)


# -- the public flash-attn functions -------------------------------------------------------------

def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                    causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> Any:
    """flash-attn 2's ``flash_attn_func``: q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d).

    flash-attn 2's semantics, which every function here keeps: ``h % hk == 0`` (GQA/MQA); scale
    defaults to 1/sqrt(d); ``causal`` and ``window_size=(left, right)`` are aligned to the
    bottom-right corner (query i sees keys in ``[i + sk - sq - left, i + sk - sq + right]``,
    -1 = unbounded); a query row with no key gives zeros; ``return_attn_probs=True`` returns
    ``(out, softmax_lse, None)`` (lse (b, h, sq) fp32, +inf for empty rows). fp32 inputs are
    accepted too (flash-attn takes only fp16/bf16). Dropout uses torch's RNG, so it matches
    flash-attn in distribution, not bit for bit.
    """
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"flash_attn_func: q, k, v must be (batch, seqlen, nheads, headdim), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}")
    _check_heads("flash_attn_func", q, k, v)
    scale, left, right = _options("flash_attn_func", q, dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, return_attn_probs)
    out, lse = attention_bshd(q, k, v, dropout_p=dropout_p, scale=scale, left=left, right=right,
                              want_lse=return_attn_probs, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                              causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Tensor | None = None, deterministic: bool = False,
                              return_attn_probs: bool = False) -> Any:
    """flash-attn 2's ``flash_attn_qkvpacked_func``: qkv (b, s, 3, h, d)."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"flash_attn_qkvpacked_func: qkv must be (batch, seqlen, 3, nheads, headdim), got "
                         f"{tuple(qkv.shape)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                             causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Tensor | None = None, deterministic: bool = False,
                             return_attn_probs: bool = False) -> Any:
    """flash-attn 2's ``flash_attn_kvpacked_func``: q (b, sq, h, d), kv (b, sk, 2, hk, d)."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"flash_attn_kvpacked_func: kv must be (batch, seqlen, 2, nheads_k, headdim), got "
                         f"{tuple(kv.shape)}")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def _paged(cache: Tensor, block_table: Tensor, lengths: list[int]) -> Tensor:
    """Gather a paged KV cache (num_blocks, block, hk, d) into packed (sum(lengths), hk, d)."""
    block = cache.shape[1]
    parts = []
    for b, n in enumerate(lengths):
        blocks = block_table[b, : (n + block - 1) // block].long()
        parts.append(cache[blocks].reshape(-1, *cache.shape[2:])[:n])
    return torch.cat(parts, dim=0)


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Tensor | None = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Tensor | None = None) -> Any:
    """flash-attn 2's ``flash_attn_varlen_func``: packed q (total_q, h, d), k/v (total_k, hk, d) (or paged)."""
    api = "flash_attn_varlen_func"
    scale, left, right = _options(api, q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  return_attn_probs)
    if block_table is not None:
        lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        k, v = _paged(k, block_table, lens), _paged(v, block_table, lens)
    _check_heads(api, q, k, v)
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p=dropout_p, scale=scale, left=left,
                                right=right, want_lse=return_attn_probs,
                                deterministic=deterministic, api=api)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: float | None = None, causal: bool = False,
                                     window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Tensor | None = None, deterministic: bool = False,
                                     return_attn_probs: bool = False) -> Any:
    """flash-attn 2's ``flash_attn_varlen_qkvpacked_func``: qkv (total, 3, h, d)."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: float | None = None, causal: bool = False,
                                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Tensor | None = None, deterministic: bool = False,
                                    return_attn_probs: bool = False) -> Any:
    """flash-attn 2's ``flash_attn_varlen_kvpacked_func``: kv (total_k, 2, hk, d)."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


@torch.no_grad()
def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None = None,
                            v: Tensor | None = None, rotary_cos: Tensor | None = None,
                            rotary_sin: Tensor | None = None, cache_seqlens: int | Tensor | None = None,
                            cache_batch_idx: Tensor | None = None, cache_leftpad: Tensor | None = None,
                            block_table: Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Tensor | None = None, num_splits: int = 0,
                            return_softmax_lse: bool = False) -> Any:
    """flash-attn 2's decoding kernel: append k/v to the cache in place (rotary optional), attend (no backward)."""
    from .rope import apply_rotary_emb

    api = "flash_attn_with_kvcache"
    if cache_leftpad is not None:
        raise _refuse(api, "cache_leftpad=...", "left-pad the cache yourself and pass cache_seqlens")
    scale, left, right = _options(api, q, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False)
    b, sq = q.shape[:2]
    paged = block_table is not None
    if paged and (k is not None or cache_batch_idx is not None):
        raise _refuse(api, "block_table with k/v or cache_batch_idx", "append to the paged cache yourself")
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    full = (block_table.shape[1] * k_cache.shape[1]) if paged else k_cache.shape[1]
    lens = cache_seqlens.long() if cache_seqlens is not None else torch.full((b,), full, device=q.device)
    idx = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(b, device=q.device)
    if k is not None:
        if v is None or cache_seqlens is None:
            raise ValueError(f"flash_attn.{api}: k needs v and cache_seqlens (where to append in the cache)")
        sn, start_pos = k.shape[1], lens
        if int((lens + sn).max()) > k_cache.shape[1]:
            raise ValueError(f"flash_attn.{api}: appending {sn} tokens overflows the cache of {k_cache.shape[1]}")
        if rotary_cos is not None:
            k = apply_rotary_emb(k, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=start_pos)
            if causal or left >= 0 or right >= 0:  # query i at position cache_seqlens + i
                q = apply_rotary_emb(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=start_pos)
            else:  # every query token at position cache_seqlens
                flat = q.reshape(b * sq, 1, *q.shape[2:])
                q = apply_rotary_emb(flat, rotary_cos, rotary_sin, rotary_interleaved,
                                     seqlen_offsets=start_pos.repeat_interleave(sq)).view(q.shape)
        for bi in range(b):
            at = int(start_pos[bi])
            k_cache[idx[bi], at:at + sn] = k[bi]
            v_cache[idx[bi], at:at + sn] = v[bi]
        lens = lens + sn
    if paged:
        n = lens.tolist()
        keys = _paged(k_cache, block_table, n)
        vals = _paged(v_cache, block_table, n)
        cu = torch.tensor([0] + n, device=q.device).cumsum(0).to(torch.int32)
        cuq = torch.arange(0, (b + 1) * sq, sq, device=q.device, dtype=torch.int32)
        # the decoding kernel has no npu counterpart: torch on every target (the lse in its layout)
        out, lse = _attention_varlen(None, q.reshape(b * sq, *q.shape[2:]), keys, vals, cuq, cu, dropout_p=0.0,
                                     scale=scale, left=left, right=right, want_lse=return_softmax_lse,
                                     deterministic=False, api=api)
        out = out.view(b, sq, *out.shape[1:])
        lse = lse.view(lse.shape[0], b, sq).transpose(0, 1) if lse is not None else None
    else:
        kc, vc = k_cache[idx], v_cache[idx]
        keep = keep_mask(sq, kc.shape[1], left, right, q.device, lengths_k=lens).unsqueeze(1)
        out, lse = sdpa_bhsd(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), dropout_p=0.0, scale=scale,
                             keep=keep, causal_fast=False, want_lse=return_softmax_lse)
        out = out.transpose(1, 2).contiguous()
    return (out, lse) if return_softmax_lse else out
