"""Rotary position embeddings on the target: flash-attn's ``apply_rotary_emb`` and megatron-core's fused RoPE."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..backend import current_target
from .fake import is_fake

__all__ = [
    "apply_rotary_emb",
    "apply_rotary_emb_torch",
    "fused_rope_sbhd",
    "fused_rope_thd",
    "rotate_half",
    "thd_positions",
]


def rotate_half(x: Tensor, interleaved: bool = False) -> Tensor:
    """``[-x2, x1]`` of the halves, or of the (even, odd) pairs when ``interleaved``."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _rotate_into(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, conjugate: bool) -> None:
    """out[..., :rd] = x[..., :rd] rotated by the half-width cos/sin (by -angle when ``conjugate``)."""
    rd = 2 * cos.shape[-1]
    if interleaved:
        x1, x2, o1, o2 = x[..., 0:rd:2], x[..., 1:rd:2], out[..., 0:rd:2], out[..., 1:rd:2]
    else:
        half = rd // 2
        x1, x2, o1, o2 = x[..., :half], x[..., half:rd], out[..., :half], out[..., half:rd]
    sign = 1.0 if conjugate else -1.0
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=sign)   # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin, value=-sign)  # x2 cos + x1 sin


class _Rotary(torch.autograd.Function):
    """The rotation written straight into the output (no temporaries, no cat); backward rotates by -angle."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rotated(x, cos, sin, interleaved, False)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        cos, sin = ctx.saved_tensors
        return _rotated(g, cos, sin, ctx.interleaved, True), None, None, None


def _rotated(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, conjugate: bool) -> Tensor:
    md = _math_dtype(x)
    xm = x if x.dtype == md else x.to(md)
    out = torch.empty_like(xm)
    rd = 2 * cos.shape[-1]
    cos_m, sin_m = cos.to(md), sin.to(md)
    if not is_fake(out):  # on fake tensors the writes compute nothing and allocate nothing (see .fake)
        _rotate_into(out, xm, cos_m, sin_m, interleaved, conjugate)
        if rd < x.shape[-1]:
            out[..., rd:].copy_(xm[..., rd:])
    del cos_m, sin_m  # freed before the conversion back, as the tables' copies always were
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x (all channels) with its first 2 * cos.shape[-1] channels rotated, in the math dtype, differentiable."""
    return _Rotary.apply(x, cos, sin, interleaved)


def _expand(half: Tensor, interleaved: bool) -> Tensor:
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


def _npu_ok(x: Tensor, rd: int, interleaved: bool, r1_batched: bool) -> bool:
    """``npu_rotary_mul``'s documented limits: 4-D input, head dim even and < 896, fewer than 1000 batch x heads,
    cos/sin broadcast as 1S1D/S11D, or BS1D/SB1D in half mode; outside them torch runs."""
    if x.dim() != 4 or rd % 2 or rd >= 896:
        return False
    b, n = (x.shape[0], x.shape[2])
    if interleaved:
        return not r1_batched and b * n < 1000
    return b < 1000 and n < 1000


def _math_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _gather(table: Tensor, pos: Tensor, fill: float) -> Tensor:
    valid = pos < table.shape[0]
    rows = table[pos.clamp(max=table.shape[0] - 1)]
    # flash-attn's kernel reads cos=1, sin=0 past the end of the table (per-sequence offsets)
    return torch.where(valid.unsqueeze(-1), rows, torch.full_like(rows, fill))


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, inplace: bool = False,
                     seqlen_offsets: int | Tensor = 0, cu_seqlens: Tensor | None = None,
                     max_seqlen: int | None = None) -> Tensor:
    """flash-attn's ``apply_rotary_emb``: x (b, s, h, d), or (total, h, d) with ``cu_seqlens``; cos/sin (s_ro, rd/2).

    As every function here: ``x * cos + rotate(x) * sin`` on the first ``rotary_dim`` channels (the rest
    pass through), rotate-half (GPT-NeoX) or interleaved (GPT-J) pairs, in fp32 like the fused kernels,
    output in the input dtype; ``npu_rotary_mul(x, r1=cos, r2=sin, rotary_mode='half'|'interleave')``
    within its limits (:func:`_npu_ok`), else torch.
    """
    return _apply_rotary_emb(current_target().kernels.get("npu_rotary_mul"), x, cos, sin, interleaved, inplace,
                             seqlen_offsets, cu_seqlens)


def apply_rotary_emb_torch(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """flash-attn's pure-torch reference ``apply_rotary_emb_torch``: x (b, s, h, d), cos/sin (s, rd/2); torch
    on every target."""
    return _apply_rotary_emb(None, x, cos, sin, interleaved, False, 0, None)


def _apply_rotary_emb(kernel: Any, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, inplace: bool,
                      seqlen_offsets: int | Tensor, cu_seqlens: Tensor | None) -> Tensor:
    if cos.shape != sin.shape or cos.dim() != 2:
        raise ValueError(f"apply_rotary_emb: cos and sin must both be (seqlen_rotary, rotary_dim / 2), "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    seqlen_ro, half = cos.shape
    rd = 2 * half
    if rd > x.shape[-1]:
        raise ValueError(f"apply_rotary_emb: rotary_dim {rd} is larger than the head dim {x.shape[-1]}")
    tensor_offsets = isinstance(seqlen_offsets, Tensor)
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"apply_rotary_emb: x must be (batch, seqlen, nheads, headdim), got {tuple(x.shape)}")
        s = x.shape[1]
        ar = torch.arange(s, device=x.device)
        if tensor_offsets:
            pos = ar.unsqueeze(0) + seqlen_offsets.to(x.device).long().unsqueeze(1)  # (b, s)
        else:
            if seqlen_offsets + s > seqlen_ro:
                raise ValueError(f"apply_rotary_emb: seqlen_offsets {seqlen_offsets} + seqlen {s} exceeds the "
                                 f"{seqlen_ro} rows of cos/sin")
            pos = ar + int(seqlen_offsets)  # (s,)
        c, sn = _gather(cos, pos, 1.0), _gather(sin, pos, 0.0)
        c, sn = (c.unsqueeze(-2), sn.unsqueeze(-2)) if tensor_offsets else (c[None, :, None], sn[None, :, None])
        view = x
    else:
        if x.dim() != 3:
            raise ValueError(f"apply_rotary_emb: with cu_seqlens x must be (total, nheads, headdim), got {tuple(x.shape)}")
        cu = cu_seqlens.to(x.device).long()
        lens = cu[1:] - cu[:-1]
        starts = torch.repeat_interleave(cu[:-1], lens)
        pos = torch.arange(x.shape[0], device=x.device) - starts
        if tensor_offsets:
            pos = pos + torch.repeat_interleave(seqlen_offsets.to(x.device).long(), lens)
        else:
            pos = pos + int(seqlen_offsets)
        c, sn = _gather(cos, pos, 1.0)[None, :, None], _gather(sin, pos, 0.0)[None, :, None]
        view = x.unsqueeze(0)
    rot = view[..., :rd]
    if kernel is not None and _npu_ok(view, rd, interleaved, tensor_offsets and cu_seqlens is None):
        out_rot = kernel(rot, _expand(c, interleaved).to(x.dtype), _expand(sn, interleaved).to(x.dtype),
                         rotary_mode="interleave" if interleaved else "half")
    else:
        out = _rotate_pairs(view, c, sn, interleaved)  # all channels: the pass-through ones copied
        out = out.squeeze(0) if cu_seqlens is not None else out
        if inplace:
            x.copy_(out)
            return x
        return out
    if cu_seqlens is not None:
        out_rot = out_rot.squeeze(0)
    if inplace:
        x[..., :rd].copy_(out_rot)
        return x
    return out_rot if rd == x.shape[-1] else torch.cat((out_rot, x[..., rd:]), dim=-1)


def fused_rope_sbhd(t: Tensor, freqs: Tensor, interleaved: bool = False) -> Tensor:
    """megatron/TE fused RoPE: t (s, b, h, d), freqs (s, 1 or b, 1, rd) angles in radians, as megatron's
    RotaryEmbedding returns them; first rd channels rotated."""
    rd = freqs.shape[-1]
    if rd > t.shape[-1]:
        raise ValueError(f"fused RoPE: rotary dim {rd} is larger than the head dim {t.shape[-1]}")
    rot = t[..., :rd]
    kernel = current_target().kernels.get("npu_rotary_mul")
    md = _math_dtype(t)
    if kernel is not None and _npu_ok(t, rd, interleaved, freqs.dim() == 4 and freqs.shape[1] > 1):
        cos_, sin_ = torch.cos(freqs.to(md)), torch.sin(freqs.to(md))
        out = kernel(rot, cos_.to(t.dtype), sin_.to(t.dtype), rotary_mode="interleave" if interleaved else "half")
    else:
        r = rot.to(md)
        first, second = (freqs[..., ::2], freqs[..., 1::2]) if interleaved else freqs.chunk(2, dim=-1)
        if torch.equal(first, second):
            # the usual table (each angle once per pair): rotate the pairs at half width
            f = first.to(md)
            return _rotate_pairs(t, torch.cos(f), torch.sin(f), interleaved)
        else:
            f = freqs.to(md)
            out = (r * torch.cos(f) + rotate_half(r, interleaved) * torch.sin(f)).to(t.dtype)
    return out if rd == t.shape[-1] else torch.cat((out, t[..., rd:]), dim=-1)


def thd_positions(cu_seqlens: Tensor, cp_size: int = 1, cp_rank: int = 0) -> Tensor:
    """Rotary positions of the tokens this context-parallel rank holds in a packed batch.

    ``cu_seqlens`` are the full (pre-CP) cumulative lengths; with CP each sequence is held as
    two chunks, ``cp_rank`` and ``2 * cp_size - cp_rank - 1`` (megatron's load-balanced split).
    """
    lens = ((cu_seqlens[1:] - cu_seqlens[:-1]) // cp_size).tolist()
    device = cu_seqlens.device
    parts = []
    for n in lens:
        if cp_size > 1:
            seg, full = n // 2, cp_size * n
            parts.append(torch.arange(cp_rank * seg, (cp_rank + 1) * seg, device=device))
            parts.append(torch.arange(full - (cp_rank + 1) * seg, full - cp_rank * seg, device=device))
        else:
            parts.append(torch.arange(n, device=device))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)


def fused_rope_thd(t: Tensor, cu_seqlens: Tensor, freqs: Tensor, cp_size: int = 1, cp_rank: int = 0,
                   interleaved: bool = False) -> Tensor:
    """Fused RoPE for packed sequences: t (total, h, d), freqs (max_s, 1, 1, rd); positions restart per sequence."""
    pos = thd_positions(cu_seqlens, cp_size, cp_rank)
    if pos.numel() != t.shape[0]:
        raise ValueError(f"fused RoPE (thd): cu_seqlens / cp_size describe {pos.numel()} tokens but t has "
                         f"{t.shape[0]}")
    if pos.numel() and int(pos.max()) >= freqs.shape[0]:
        raise ValueError(f"fused RoPE (thd): positions reach {int(pos.max())} but freqs has {freqs.shape[0]} rows")
    return fused_rope_sbhd(t.unsqueeze(1), freqs[pos.to(freqs.device)], interleaved).squeeze(1)
