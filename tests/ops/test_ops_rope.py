"""Rotary embeddings: flash-attn's apply_rotary_emb and megatron's fused RoPE against explicit rotations."""

from __future__ import annotations

import pytest
import torch

from ascend_patch.adaptors.megatron import fusions as F
from ascend_patch.ops import rope as R
from npu_references import CallLog, reference_npu_rotary_mul


def explicit_rotation(x, cos, sin, positions, interleaved):
    """Rotate each channel pair of x (..., s, h, d) by the angle table row of its position, in float64.

    ``positions`` has x's leading (batch, seq) shape or just (seq,); pairs are (i, i + rd/2), or (2i, 2i+1).
    """
    half = cos.shape[-1]
    rd = 2 * half
    out = x.double().clone()
    c = cos.double()[positions].unsqueeze(-2)  # (..., s, 1, rd/2)
    s = sin.double()[positions].unsqueeze(-2)
    first = torch.arange(0, rd, 2) if interleaved else torch.arange(half)
    second = first + 1 if interleaved else first + half
    a, b = x.double()[..., first], x.double()[..., second]
    out[..., first] = a * c - b * s
    out[..., second] = a * s + b * c
    return out


def table(n, half):
    theta = torch.arange(n).double().unsqueeze(1) * (1.0 / 10000 ** (torch.arange(half).double() / half))
    return theta.cos().float(), theta.sin().float()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_apply_rotary_emb_matches_the_rotation(seeded, interleaved, dtype, rotary_dim):
    x = torch.randn(2, 9, 3, 32).to(dtype)
    cos, sin = table(20, rotary_dim // 2)
    out = R.apply_rotary_emb(x, cos.to(dtype), sin.to(dtype), interleaved)
    ref = explicit_rotation(x, cos.to(dtype), sin.to(dtype), torch.arange(9), interleaved)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, **tol)
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])  # the rest passes through


def test_offsets_varlen_inplace_and_backward(seeded):
    cos, sin = table(16, 4)
    x = torch.randn(3, 5, 2, 8)
    offsets = torch.tensor([0, 4, 13])  # 13 + 5 > 16 rows: flash-attn reads cos=1, sin=0 past the table
    out = R.apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
    pos = torch.arange(5).unsqueeze(0) + offsets.unsqueeze(1)
    ref = explicit_rotation(x, torch.cat((cos, torch.ones(8, 4))), torch.cat((sin, torch.zeros(8, 4))), pos, False)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="exceeds the 16 rows"):
        R.apply_rotary_emb(x, cos, sin, seqlen_offsets=12)
    packed = torch.randn(9, 2, 8)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = R.apply_rotary_emb(packed, cos, sin, interleaved=True, cu_seqlens=cu, max_seqlen=5, seqlen_offsets=2)
    ref = explicit_rotation(packed, cos, sin, torch.tensor([2, 3, 4, 5, 2, 3, 4, 5, 6]), True)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)
    y = x.clone()
    assert R.apply_rotary_emb(y, cos, sin, inplace=True) is y
    torch.testing.assert_close(y, R.apply_rotary_emb(x, cos, sin), atol=0, rtol=0)
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)
    (grad,) = torch.autograd.grad(R.apply_rotary_emb(xg, cos, sin), xg, g)
    # the rotation is orthogonal: its backward is the rotation by -angle
    torch.testing.assert_close(grad.double(), explicit_rotation(g, cos, -sin, torch.arange(5), False),
                               atol=1e-6, rtol=1e-6)


def _freqs(s, rd, interleaved, b=1):
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    f = torch.outer(torch.arange(s).float(), inv)
    emb = torch.stack((f, f), -1).flatten(-2) if interleaved else torch.cat((f, f), -1)
    return emb[:, None, None, :].expand(s, b, 1, rd).contiguous()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_megatron_fused_rope_equals_megatrons_unfused_path(seeded, interleaved, dtype):
    from megatron.core.models.common.embeddings import rope_utils

    t = torch.randn(12, 2, 4, 32).to(dtype)
    freqs = _freqs(12, 24, interleaved)  # rotary dim 24 of 32
    fused = F.fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved)
    stock = rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)
    half = freqs[:, 0, 0, ::2] if interleaved else freqs[:, 0, 0, :12]
    ref = explicit_rotation(t.transpose(0, 1), half.cos(), half.sin(), torch.arange(12), interleaved).transpose(0, 1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(fused.double(), ref, **tol)
    torch.testing.assert_close(fused.double(), stock.double(), **tol)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cp_size,cp_rank", [(1, 0), (2, 0), (2, 1)])
def test_megatron_fused_rope_thd_equals_megatrons_unfused_path(seeded, cp_size, cp_rank, interleaved):
    from megatron.core.models.common.embeddings import rope_utils

    class Group:
        def size(self):
            return cp_size

        def rank(self):
            return cp_rank

    full = [8, 4, 12]  # global sequence lengths; each CP rank holds 1/cp_size of each
    cu = torch.tensor([0, *torch.tensor(full).cumsum(0).tolist()], dtype=torch.int32)
    t = torch.randn(sum(full) // cp_size, 3, 16)
    freqs = _freqs(32, 16, interleaved)
    # megatron-core main passes interleaved= (config.rotary_interleaved); earlier releases never do
    rotary = {"interleaved": True} if interleaved else {}
    fused = F.fused_apply_rotary_pos_emb_thd(t, cu, freqs, cp_size=cp_size, cp_rank=cp_rank, **rotary)
    stock = rope_utils._apply_rotary_pos_emb_thd(t, cu, freqs, rotary_interleaved=interleaved, cp_group=Group())
    torch.testing.assert_close(fused, stock, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="describe 12 tokens but t has 11"):
        R.fused_rope_thd(t[:11], cu, freqs, 2, 0) if cp_size == 2 else R.fused_rope_thd(t[:11], cu // 2, freqs)


@pytest.mark.parametrize("interleaved", [False, True])
def test_npu_rotary_mul_translation(target, seeded, interleaved):
    log = CallLog(reference_npu_rotary_mul)
    x = torch.randn(2, 7, 3, 16)
    cos, sin = table(10, 8)
    t = torch.randn(7, 2, 3, 16)
    freqs = _freqs(7, 16, interleaved)
    with target.kernels.override(npu_rotary_mul=log):
        out = R.apply_rotary_emb(x, cos, sin, interleaved)
        fused = R.fused_rope_sbhd(t, freqs, interleaved)
        R.apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=torch.tensor([0, 3]))
    mode = "interleave" if interleaved else "half"
    assert [c["rotary_mode"] for c in log.calls] == [mode, mode] + ([] if interleaved else ["half"])
    assert tuple(log.calls[0]["args"][1].shape) == (1, 7, 1, 16)    # BSND with 1S1D cos
    assert tuple(log.calls[1]["args"][1].shape) == (7, 1, 1, 16)    # SBND with S11D cos
    if not interleaved:
        assert tuple(log.calls[2]["args"][1].shape) == (2, 7, 1, 16)  # per-batch offsets: BS1D, half mode only
    torch.testing.assert_close(out, R.apply_rotary_emb(x, cos, sin, interleaved), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fused, R.fused_rope_sbhd(t, freqs, interleaved), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_megatron_fused_rope_with_an_arbitrary_angle_table(seeded, interleaved):
    """freqs whose pairs do not share an angle take the full-width formula (TE applies freqs as given)."""
    from megatron.core.models.common.embeddings import rope_utils

    t = torch.randn(6, 2, 2, 16)
    freqs = torch.rand(6, 1, 1, 16) * 6
    fused = R.fused_rope_sbhd(t, freqs, interleaved)
    stock = rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)
    torch.testing.assert_close(fused, stock, atol=1e-6, rtol=1e-6)
