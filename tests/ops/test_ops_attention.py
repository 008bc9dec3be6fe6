"""flash-attn 2 API: numerics against explicit softmax attention, and the npu translation."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_patch.ops import attention as A
from ascend_patch.unsupported import UnsupportedOption
from npu_references import CallLog, reference_npu_fusion_attention

# fp32 against a float64 reference; bf16 inputs against the float64 reference on the same (rounded) inputs
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def explicit_attention(q, k, v, causal=False, window=(-1, -1), scale=None):
    """Textbook softmax attention in float64, flash-attn's bottom-right aligned band, empty rows -> 0."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    kk = k.double().repeat_interleave(h // hk, dim=2)
    vv = v.double().repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * (scale if scale is not None else d ** -0.5)
    left, right = window
    if causal:
        right = 0
    keep = torch.ones(sq, sk, dtype=torch.bool)
    for i in range(sq):
        for j in range(sk):
            diag = i + sk - sq
            if left >= 0 and j < diag - left:
                keep[i, j] = False
            if right >= 0 and j > diag + right:
                keep[i, j] = False
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, -1)
    probs = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vv)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    return out, lse


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


CASES = [  # (sq, sk, heads, kv_heads, causal, window)
    (16, 16, 4, 4, False, (-1, -1)),
    (16, 16, 4, 4, True, (-1, -1)),
    (9, 23, 4, 2, True, (-1, -1)),      # sq < sk, GQA: bottom-right causal
    (23, 9, 4, 1, True, (-1, -1)),      # sq > sk, MQA: the first rows see no key
    (16, 16, 6, 2, False, (3, 2)),      # sliding window, both sides
    (16, 16, 4, 4, True, (4, -1)),      # causal sliding window
    (10, 30, 4, 4, False, (5, -1)),     # sq != sk window
    (30, 10, 2, 2, False, (-1, 0)),     # causal written as a window
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sq,sk,h,hk,causal,window", CASES)
def test_flash_attn_func_matches_explicit_attention(seeded, dtype, sq, sk, h, hk, causal, window):
    q, k, v = rand(2, sq, h, 32, dtype=dtype), rand(2, sk, hk, 32, dtype=dtype), rand(2, sk, hk, 32, dtype=dtype)
    out = A.flash_attn_func(q, k, v, causal=causal, window_size=window)
    ref, _ = explicit_attention(q, k, v, causal, window)
    assert out.dtype == dtype and out.shape == (2, sq, h, 32) and out.is_contiguous()
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])


def test_rows_without_keys_are_zero_and_have_infinite_lse(seeded):
    q, k, v = rand(1, 6, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8)
    out, lse, s_dmask = A.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert s_dmask is None
    assert torch.equal(out[0, :3], torch.zeros_like(out[0, :3]))  # rows 0-2 see no key when sq=6 > sk=3
    assert torch.isinf(lse[0, :, :3]).all() and (lse[0, :, :3] > 0).all()
    ref_out, ref_lse = explicit_attention(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double()[..., 3:], ref_lse[..., 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 3))])
def test_softmax_lse_and_scale(seeded, causal, window):
    q, k, v = rand(2, 12, 4, 16), rand(2, 12, 2, 16), rand(2, 12, 2, 16)
    out, lse, _ = A.flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal, window_size=window,
                                    return_attn_probs=True)
    ref_out, ref_lse = explicit_attention(q, k, v, causal, window, scale=0.3)
    assert lse.shape == (2, 4, 12) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (3, 1))])
def test_gradients_match_explicit_attention(seeded, causal, window):
    q, k, v = (rand(2, 10, 4, 16).requires_grad_(), rand(2, 14, 2, 16).requires_grad_(),
               rand(2, 14, 2, 16).requires_grad_())
    g = torch.randn(2, 10, 4, 16)
    grads = torch.autograd.grad(A.flash_attn_func(q, k, v, causal=causal, window_size=window), (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.autograd.grad(explicit_attention(q64, k64, v64, causal, window)[0], (q64, k64, v64), g.double())
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_packed_variants_equal_the_unpacked_call(seeded):
    q, k, v = rand(2, 8, 4, 16), rand(2, 8, 4, 16), rand(2, 8, 4, 16)
    ref = A.flash_attn_func(q, k, v, causal=True)
    qkv = torch.stack((q, k, v), dim=2)
    torch.testing.assert_close(A.flash_attn_qkvpacked_func(qkv, causal=True), ref, atol=0, rtol=0)
    torch.testing.assert_close(A.flash_attn_kvpacked_func(q, torch.stack((k, v), dim=2), causal=True), ref,
                               atol=0, rtol=0)


def _pack(lengths, h, d, dtype):
    return torch.randn(sum(lengths), h, d).to(dtype), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                                                    dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (2, -1)), (False, (1, 1))])
def test_varlen_with_unequal_lengths(seeded, dtype, causal, window):
    lq, lk = [3, 7, 1, 5], [3, 9, 4, 5]  # sequence 1 and 2 have sq != sk
    q, cu_q = _pack(lq, 4, 16, dtype)
    k, cu_k = _pack(lk, 2, 16, dtype)
    v, _ = _pack(lk, 2, 16, dtype)
    out, lse, _ = A.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window,
                                           return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lq))
    for i in range(len(lq)):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        ref, ref_lse = explicit_attention(q[qs][None], k[ks][None], v[ks][None], causal, window)
        torch.testing.assert_close(out[qs].double(), ref[0], **TOL[dtype])
        finite = torch.isfinite(ref_lse[0])
        torch.testing.assert_close(lse[:, qs].double()[finite], ref_lse[0][finite], atol=1e-2, rtol=1e-2)


def test_varlen_packed_and_paged_kv(seeded):
    lq, lk = [2, 5], [6, 3]
    q, cu_q = _pack(lq, 2, 8, torch.float32)
    k, cu_k = _pack(lk, 2, 8, torch.float32)
    v, _ = _pack(lk, 2, 8, torch.float32)
    ref = A.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, causal=True)
    kv = torch.stack((k, v), dim=1)
    torch.testing.assert_close(A.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 5, 6, causal=True), ref,
                               atol=0, rtol=0)
    # the same keys in a paged cache of blocks of 4 tokens, in scrambled block order
    block = 4
    cache_k, cache_v = torch.zeros(6, block, 2, 8), torch.zeros(6, block, 2, 8)
    table = torch.tensor([[4, 1], [2, 0]], dtype=torch.int32)
    for b, n in enumerate(lk):
        src = slice(int(cu_k[b]), int(cu_k[b + 1]))
        flat_k = cache_k[table[b].long()].reshape(-1, 2, 8)
        flat_v = cache_v[table[b].long()].reshape(-1, 2, 8)
        flat_k[:n], flat_v[:n] = k[src], v[src]
        cache_k[table[b].long()] = flat_k.view(-1, block, 2, 8)
        cache_v[table[b].long()] = flat_v.view(-1, block, 2, 8)
    paged = A.flash_attn_varlen_func(q, cache_k, cache_v, cu_q, cu_k, 5, 6, causal=True, block_table=table)
    torch.testing.assert_close(paged, ref, atol=1e-6, rtol=1e-6)


def test_dropout_zero_is_exact_and_dropout_has_the_right_statistics(seeded):
    q, k, v = rand(2, 16, 2, 8), rand(2, 16, 2, 8), rand(2, 16, 2, 8)
    assert torch.equal(A.flash_attn_func(q, k, v, dropout_p=0.0), A.flash_attn_func(q, k, v))
    # q = 0: uniform probabilities 1/sk; v = 1: each output is (kept keys / sk) / (1 - p)
    p, sk = 0.25, 64
    q0, k0, v1 = torch.zeros(4, 32, 4, 8), torch.randn(4, sk, 4, 8), torch.ones(4, sk, 4, 8)
    out = A.flash_attn_func(q0, k0, v1, dropout_p=p)
    kept = out[..., 0] * sk * (1 - p)
    assert torch.allclose(kept, kept.round(), atol=1e-3)  # an integer count of kept keys per row
    assert abs(out.mean().item() - 1.0) < 0.02             # unbiased: E[out] = 1
    assert abs(kept.mean().item() / sk - (1 - p)) < 0.02    # keep rate 1 - p over 512 rows x 64 keys
    torch.manual_seed(7)
    first = A.flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    assert torch.equal(first, A.flash_attn_func(q, k, v, dropout_p=0.5))  # deterministic under a seed


@pytest.mark.parametrize("kwargs,match", [
    (dict(softcap=30.0), "softcap=30.0"),
    (dict(alibi_slopes=torch.ones(2)), "alibi_slopes"),
    (dict(dropout_p=0.1, return_attn_probs=True), "S_dmask"),
])
def test_unsupported_options_are_refused_by_name(kwargs, match):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(NotImplementedError, match=match) as info:
        A.flash_attn_func(q, q, q, **kwargs)
    assert "flash_attn.flash_attn_func" in str(info.value)
    assert isinstance(info.value, UnsupportedOption)  # the package's error (a command prints its message)


def test_shape_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of .* key/value heads \(2\)"):
        A.flash_attn_func(torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8))
    q, cu = _pack([2, 3], 2, 8, torch.float32)
    with pytest.raises(ValueError, match="end at the token count 5"):
        A.flash_attn_varlen_func(q, q, q, torch.tensor([0, 2, 4], dtype=torch.int32), cu, 3, 3)


def test_kvcache_decoding_appends_in_place_and_attends(seeded):
    b, cache_len, h, d = 2, 10, 2, 8
    k_cache, v_cache = torch.randn(b, cache_len, h, d), torch.randn(b, cache_len, h, d)
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    q, k_new, v_new = torch.randn(b, 2, h, d), torch.randn(b, 2, h, d), torch.randn(b, 2, h, d)
    before = k_cache.clone()
    out, lse = A.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True,
                                         return_softmax_lse=True)
    for i, n in enumerate(seqlens.tolist()):
        assert torch.equal(k_cache[i, n:n + 2], k_new[i]) and torch.equal(k_cache[i, :n], before[i, :n])
        ref, ref_lse = explicit_attention(q[i:i + 1], k_cache[i:i + 1, :n + 2], v_cache[i:i + 1, :n + 2], causal=True)
        torch.testing.assert_close(out[i:i + 1].double(), ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse[i:i + 1].double(), ref_lse, atol=1e-5, rtol=1e-5)


# -- the npu translation, against the reference npu_fusion_attention -------------------------

@pytest.mark.parametrize("sq,sk,h,hk,causal,window,mode,pre,nxt", [
    (12, 12, 4, 4, False, (-1, -1), 0, 2147483647, 2147483647),
    (8, 20, 4, 2, True, (-1, -1), 3, 2147483647, 0),   # sq != sk causal -> rightDownCausal
    (20, 8, 4, 1, True, (-1, -1), 3, 2147483647, 0),
    (16, 16, 4, 4, False, (3, 2), 4, 3, 2),            # sliding window -> band
    (10, 24, 2, 2, True, (5, -1), 4, 5, 0),            # causal window, sq != sk
    (16, 16, 2, 2, False, (-1, 4), 4, 2147483647, 4),
])
def test_npu_translation_reproduces_flash_attn(target, seeded, sq, sk, h, hk, causal, window, mode, pre, nxt):
    q, k, v = rand(2, sq, h, 16), rand(2, sk, hk, 16), rand(2, sk, hk, 16)
    log = CallLog(reference_npu_fusion_attention)
    with target.kernels.override(npu_fusion_attention=log):
        out, lse, _ = A.flash_attn_func(q, k, v, softmax_scale=0.2, causal=causal, window_size=window,
                                        return_attn_probs=True)
    (call,) = log.calls
    assert call["args"][3:] == (h, "BSND")  # head_num = query heads, layout BSND
    assert (call["sparse_mode"], call["pre_tockens"], call["next_tockens"]) == (mode, pre, nxt)
    assert call["scale"] == 0.2 and call["keep_prob"] == 1.0
    assert (call["atten_mask"] is None) == (mode == 0)
    ref_out, ref_lse = explicit_attention(q, k, v, causal, window, scale=0.2)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=2e-5)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal,window,mode", [(False, (-1, -1), 0), (True, (-1, -1), 3), (False, (2, 1), 4)])
def test_npu_varlen_translation_uses_tnd_and_cumulative_lengths(target, seeded, causal, window, mode):
    lq, lk = [3, 6, 2], [3, 8, 5]
    q, cu_q = _pack(lq, 4, 16, torch.float32)
    k, cu_k = _pack(lk, 2, 16, torch.float32)
    v, _ = _pack(lk, 2, 16, torch.float32)
    log = CallLog(reference_npu_fusion_attention)
    with target.kernels.override(npu_fusion_attention=log):
        out = A.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 8, dropout_p=0.0, causal=causal, window_size=window)
    (call,) = log.calls
    assert call["args"][3:] == (4, "TND") and call["sparse_mode"] == mode
    assert call["actual_seq_qlen"] == [3, 9, 11] and call["actual_seq_kvlen"] == [3, 11, 16]  # no leading 0
    expected = A.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 8, causal=causal, window_size=window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_npu_dropout_is_passed_as_keep_prob_and_lse_is_refused_for_varlen(target):
    q = torch.randn(1, 8, 2, 16)
    seen = []

    def recording_kernel(*args, **kwargs):
        seen.append(kwargs["keep_prob"])
        return (args[0].clone(),) + (None,) * 6

    with target.kernels.override(npu_fusion_attention=recording_kernel):
        A.flash_attn_func(q, q, q, dropout_p=0.1)
        assert seen == [pytest.approx(0.9)]
        packed, cu = _pack([3, 5], 2, 16, torch.float32)
        with pytest.raises(NotImplementedError, match="return_attn_probs=True"):
            A.flash_attn_varlen_func(packed, packed, packed, cu, cu, 5, 5, return_attn_probs=True)


def test_npu_limits_fall_back_to_torch(target, seeded):
    q = torch.randn(1, 4, 2, 1024)  # head dim 1024 > the kernel's 768
    called = []
    with target.kernels.override(npu_fusion_attention=lambda *a, **k: called.append(1)):
        out = A.flash_attn_func(q, q, q)
    assert not called
    torch.testing.assert_close(out.double(), explicit_attention(q, q, q)[0], atol=2e-5, rtol=2e-5)


def _grads(fn, inputs, g):
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("sq,sk,causal,window", [(64, 64, True, (-1, -1)), (48, 64, True, (-1, -1)),
                                                 (64, 64, False, (-1, -1)), (64, 64, False, (8, 0))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_backward_is_deterministic(seeded, sq, sk, causal, window, dtype):
    """deterministic=True on cpu: repeated backward passes give bitwise-identical dq, dk, dv (GQA, 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q = torch.randn(2, sq, 8, 32, dtype=dtype, requires_grad=True)
        k = torch.randn(2, sk, 2, 32, dtype=dtype, requires_grad=True)
        v = torch.randn(2, sk, 2, 32, dtype=dtype, requires_grad=True)
        g = torch.randn(2, sq, 8, 32, dtype=dtype)

        def call(q, k, v):
            return A.flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True)

        first = _grads(call, (q, k, v), g)
        for _ in range(2):
            again = _grads(call, (q, k, v), g)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
        packed, cu = _pack([20, 33, 11], 4, 32, dtype)
        packed.requires_grad_()
        gp = torch.randn_like(packed)

        def varlen(x):
            return A.flash_attn_varlen_func(x, x, x, cu, cu, 33, 33, causal=causal, deterministic=True)

        (dx,) = _grads(varlen, (packed,), gp)
        (dx2,) = _grads(varlen, (packed,), gp)
        assert torch.equal(dx, dx2)
    finally:
        torch.set_num_threads(threads)


def test_npu_deterministic_needs_torch_npus_deterministic_mode(target, seeded):
    """npu_fusion_attention has no deterministic flag: deterministic=True warns unless the mode is on."""
    import warnings

    from ascend_patch.backend import cpu_backend, using_target

    q = torch.randn(1, 8, 2, 16)
    packed, cu = _pack([3, 5], 2, 16, torch.float32)
    was = torch.are_deterministic_algorithms_enabled()
    with target.kernels.override(npu_fusion_attention=CallLog(reference_npu_fusion_attention)):
        try:
            torch.use_deterministic_algorithms(False)
            with pytest.warns(UserWarning, match=r"torch.use_deterministic_algorithms\(True\)"):
                A.flash_attn_func(q, q, q, deterministic=True)
            with pytest.warns(UserWarning, match="flash_attn_varlen_func\\(deterministic=True\\)"):
                A.flash_attn_varlen_func(packed, packed, packed, cu, cu, 5, 5, deterministic=True)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                A.flash_attn_func(q, q, q, deterministic=False)
                with using_target(cpu_backend("tests: no kernels")):
                    A.flash_attn_func(q, q, q, deterministic=True)  # the cpu path: deterministic already
                torch.use_deterministic_algorithms(True)
                A.flash_attn_func(q, q, q, deterministic=True)
        finally:
            torch.use_deterministic_algorithms(was)
