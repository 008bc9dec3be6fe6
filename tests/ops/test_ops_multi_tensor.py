"""amp_C multi-tensor ops: values against explicit references, and the overflow flag that must never drop."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_patch.ops import multi_tensor as MT
from textbook import textbook_adam


def flag():
    return torch.zeros(1, dtype=torch.int)


def tensors(dtype=torch.float32, shapes=((7, 3), (64,), (2, 2, 5))):
    torch.manual_seed(3)
    return [torch.randn(*s).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_l2norm_matches_the_definition(dtype, per_tensor):
    ts = tensors(dtype)
    noop = flag()
    total, per = MT.multi_tensor_applier(MT.multi_tensor_l2norm, noop, [ts], per_tensor)
    want_per = [math.sqrt(sum(float(x) ** 2 for x in t.double().flatten())) for t in ts]
    want = math.sqrt(sum(n * n for n in want_per))
    assert total.shape == (1,) and total.dtype == torch.float32
    assert total.item() == pytest.approx(want, rel=1e-6)
    if per_tensor:
        assert per.tolist() == pytest.approx(want_per, rel=1e-6)
    else:
        assert per.numel() == 0
    assert noop.item() == 0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_l2norm_sets_the_flag_on_inf_and_nan(bad):
    ts = tensors()
    ts[1][17] = bad
    noop = flag()
    total, _ = MT.multi_tensor_l2norm(2048, noop, [ts], False)
    assert noop.item() == 1 and not math.isfinite(total.item())


def test_flag_is_sticky_and_never_cleared():
    noop = torch.ones(1, dtype=torch.int)
    MT.multi_tensor_l2norm(2048, noop, [tensors()], False)
    MT.multi_tensor_scale(2048, noop, [tensors(), tensors()], 0.5)
    assert noop.item() == 1


@pytest.mark.parametrize("in_dtype,out_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
    (torch.float16, torch.float16)])
def test_scale_out_of_place(in_dtype, out_dtype):
    ins = tensors(in_dtype)
    outs = [torch.empty_like(t, dtype=out_dtype) for t in ins]
    noop = flag()
    MT.multi_tensor_applier(MT.multi_tensor_scale, noop, [ins, outs], 0.125)
    for i, o in zip(ins, outs):
        assert o.dtype == out_dtype
        torch.testing.assert_close(o, (i.float() * 0.125).to(out_dtype), atol=0, rtol=0)  # fp32 math, one rounding
    assert noop.item() == 0


def test_scale_in_place_and_the_flag():
    ins = tensors()
    expect = [t * 4.0 for t in ins]
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [ins, ins], 4.0)
    for got, want in zip(ins, expect):
        assert torch.equal(got, want)
    assert noop.item() == 0
    ins[0][0, 0] = math.nan
    MT.multi_tensor_scale(2048, noop, [ins, ins], 1.0)
    assert noop.item() == 1
    narrow_noop = flag()
    src = tensors()
    src[2][0, 0, 0] = math.inf
    MT.multi_tensor_scale(2048, narrow_noop, [src, [torch.empty_like(t, dtype=torch.bfloat16) for t in src]], 1.0)
    assert narrow_noop.item() == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("in_dtype,out_dtype", [
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.float32)])
def test_copy_at_scale_one_copies_exactly_and_flags_any_bad_input(bad, in_dtype, out_dtype):
    # megatron's main <-> model param copies: multi_tensor_scale(..., [this, that], 1.0)
    ins = tensors(in_dtype) + [torch.empty(0, dtype=in_dtype)]
    outs = [torch.empty_like(t, dtype=out_dtype) for t in ins]
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [ins, outs], 1.0)
    assert noop.item() == 0
    for i, o in zip(ins, outs):
        assert torch.equal(o, i.to(out_dtype))
    ins[-2].view(-1)[-1] = bad  # the last element of the last non-empty tensor
    MT.multi_tensor_scale(2048, noop, [ins, outs], 1.0)
    assert noop.item() == 1
    assert torch.equal(outs[-2].view(-1)[-1:].isnan(), torch.tensor([math.isnan(bad)]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("in_dtype,out_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
    (torch.float16, torch.float16)])
def test_scale_out_of_place_flags_a_bad_input(bad, in_dtype, out_dtype):
    """scale != 1 into separate outputs (same, wider and narrower dtypes): an inf/nan input sets the flag."""
    ins = tensors(in_dtype)
    ins[1][40] = bad
    outs = [torch.empty_like(t, dtype=out_dtype) for t in ins]
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [ins, outs], 0.5)
    assert noop.item() == 1
    for i, o in zip(ins, outs):  # the finite values are still scaled (apex writes them too)
        finite = torch.isfinite(i)
        torch.testing.assert_close(o[finite], (i[finite].float() * 0.5).to(out_dtype), atol=0, rtol=0)
    clean = tensors(in_dtype)
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [clean, [torch.empty_like(t, dtype=out_dtype) for t in clean]], 2.0)
    assert noop.item() == 0


def test_copy_at_scale_one_of_integer_tensors():
    ins = [torch.arange(10, dtype=torch.int64), torch.arange(4, dtype=torch.int64)]
    outs = [torch.empty(10, dtype=torch.int64), torch.empty(4, dtype=torch.int64)]
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [ins, outs], 1.0)
    assert noop.item() == 0 and all(torch.equal(i, o) for i, o in zip(ins, outs))


def test_scale_checks_the_input_not_the_narrowed_output():
    big = [torch.tensor([1e30])]  # finite in fp32, inf once stored as fp16: apex checks the input
    noop = flag()
    out = [torch.empty(1, dtype=torch.float16)]
    MT.multi_tensor_scale(2048, noop, [big, out], 1.0)
    assert noop.item() == 0 and torch.isinf(out[0]).all()


def test_axpby_and_its_checked_argument():
    xs, ys = tensors(), [t * 2 for t in tensors()]
    outs = [torch.empty_like(t) for t in xs]
    noop = flag()
    MT.multi_tensor_axpby(2048, noop, [xs, ys, outs], 2.0, -0.5, -1)
    for x, y, o in zip(xs, ys, outs):
        torch.testing.assert_close(o, 2.0 * x - 0.5 * y)
    ys[0][0, 0] = math.inf
    MT.multi_tensor_axpby(2048, noop, [xs, ys, outs], 1.0, 1.0, 0)  # only xs checked
    assert noop.item() == 0
    MT.multi_tensor_axpby(2048, noop, [xs, ys, outs], 1.0, 1.0, 1)
    assert noop.item() == 1


def test_multi_tensor_adam_equals_fused_adam_and_ignores_the_flag():
    from ascend_patch.ops.optim import ApexFusedAdam

    torch.manual_seed(0)
    p1 = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(2)]
    p2 = [torch.nn.Parameter(p.detach().clone()) for p in p1]
    opt = ApexFusedAdam(p1, lr=1e-2, weight_decay=0.1)
    m = [torch.zeros_like(p) for p in p2]
    v = [torch.zeros_like(p) for p in p2]
    noop = torch.ones(1, dtype=torch.int)  # apex's adam kernel propagates inf/nan instead of skipping
    for step in range(1, 4):
        g = [torch.randn(4, 4) for _ in p1]
        for p, gi in zip(p1, g):
            p.grad = gi.clone()
        opt.step()
        MT.multi_tensor_applier(MT.multi_tensor_adam, noop, [g, [p.data for p in p2], m, v], 1e-2, 0.9, 0.999, 1e-8,
                                step, 1, 1, 0.1)
    for a, b in zip(p1, p2):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("bias_correction", [0, 1])
def test_multi_tensor_adam_matches_textbook_adam(mode, bias_correction):
    """amp_C.multi_tensor_adam over 10 steps with weight decay (mode 1 = AdamW, 0 = L2) against the textbook."""
    torch.manual_seed(0)
    shapes = ((4, 4), (9,), (2, 3, 5))
    start = [torch.randn(*s) for s in shapes]
    grads = [[torch.randn(*s) for s in shapes] for _ in range(10)]
    p = [t.clone() for t in start]
    m = [torch.zeros_like(t) for t in p]
    v = [torch.zeros_like(t) for t in p]
    for step, g in enumerate(grads, start=1):
        MT.multi_tensor_applier(MT.multi_tensor_adam, flag(), [g, p, m, v], 1e-2, 0.9, 0.99, 1e-8, step, mode,
                                bias_correction, 0.05)
    ref_p, ref_m, ref_v = textbook_adam(start, grads, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, wd=0.05,
                                        decoupled=bool(mode), bias_correction=bool(bias_correction))
    for got, want in zip(p + m + v, ref_p + ref_m + ref_v):
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


def test_capturable_adam_unscales_reads_tensors_and_skips_on_the_flag():
    torch.manual_seed(0)
    w = [torch.randn(5), torch.randn(3)]
    g = [torch.randn(5), torch.randn(3)]
    ref_w = [t.clone() for t in w]
    m1, v1 = [torch.zeros_like(t) for t in w], [torch.zeros_like(t) for t in w]
    m2, v2 = [torch.zeros_like(t) for t in w], [torch.zeros_like(t) for t in w]
    before = [t.clone() for t in w]
    MT.multi_tensor_adam_capturable(2048, torch.ones(1, dtype=torch.int), [g, w, m1, v1], torch.tensor(0.1), 0.9,
                                    0.999, 1e-8, torch.tensor([1]), 1, 1, 0.01, torch.tensor([0.5]))
    assert all(torch.equal(a, b) for a, b in zip(w, before))  # overflow seen upstream: no update
    MT.multi_tensor_adam_capturable(2048, flag(), [g, w, m1, v1], torch.tensor(0.1), 0.9, 0.999, 1e-8,
                                    torch.tensor([1]), 1, 1, 0.01, torch.tensor([0.5]))
    MT.multi_tensor_adam(2048, flag(), [[0.5 * t for t in g], ref_w, m2, v2], 0.1, 0.9, 0.999, 1e-8, 1, 1, 1, 0.01)
    for a, b in zip(w, ref_w):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_multi_tensor_sgd_exits_early_on_a_set_flag():
    w = tensors()
    before = [t.clone() for t in w]
    g = tensors()
    mom = [torch.zeros_like(t) for t in w]
    MT.multi_tensor_sgd(2048, torch.ones(1, dtype=torch.int), [g, w, mom], 0.0, 0.9, 0.0, 0.1, False, True, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(w, before))
    g_before = [t.clone() for t in g]
    MT.multi_tensor_sgd(2048, flag(), [g, w, mom], 0.0, 0.9, 0.0, 0.1, False, True, False, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(g, g_before))  # grads are read, never scaled in place
    for a, b, gi, m in zip(w, before, g, mom):
        torch.testing.assert_close(a, b - 0.1 * 0.5 * gi)  # first run: momentum = scaled grad
        torch.testing.assert_close(m, 0.5 * gi)
    w2 = [t.clone() for t in w]
    MT.multi_tensor_sgd(2048, flag(), [g, w, mom], 0.01, 0.9, 0.0, 0.1, True, False, False, 1.0)  # fused path
    assert all(torch.equal(a, b) for a, b in zip(g, g_before))
    for a, b, gi, m0 in zip(w, w2, g, [0.5 * t for t in g_before]):
        d = gi + 0.01 * b
        buf = 0.9 * m0 + d
        torch.testing.assert_close(a, b - 0.1 * (d + 0.9 * buf))  # nesterov, decay before momentum


def test_appliers():
    seen = []
    MT.multi_tensor_applier(lambda chunk, noop, lists, *a: seen.append((chunk, a)), flag(), [[]], 1, 2)
    assert seen == [(2048 * 32, (1, 2))] and MT.multi_tensor_applier.available is True
    kept = []
    result = MT.te_multi_tensor_applier(lambda chunk, noop, lists: kept.append(lists), flag(),
                                        [[torch.ones(2), torch.ones(0)], [torch.ones(2), torch.ones(0)]])
    assert result is None and [len(x) for x in kept[0]] == [1, 1]  # TE drops empty tensors
    assert MT.te_multi_tensor_applier(lambda *a: 1, flag(), [[torch.ones(0)]]) is None
    with pytest.raises(RuntimeError, match="aligned"):
        MT.te_multi_tensor_applier(lambda *a: 1, flag(), [[torch.ones(1)], []])


def test_copy_at_scale_one_whose_sum_overflows_is_not_flagged():
    """Huge but finite values: the cheap first check (a sum) overflows; the exact check must clear them."""
    big = [torch.full((1000,), 3e38), torch.full((7,), -3e38)]
    outs = [torch.empty_like(t) for t in big]
    noop = flag()
    MT.multi_tensor_scale(2048, noop, [big, outs], 1.0)
    assert noop.item() == 0 and all(torch.equal(i, o) for i, o in zip(big, outs))
    big[1][3] = math.nan
    MT.multi_tensor_scale(2048, noop, [big, outs], 1.0)
    assert noop.item() == 1
