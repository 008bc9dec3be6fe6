"""The grouped GEMM against per-group matmuls written here, on the cpu path and through the npu kernel."""

from __future__ import annotations

import pytest
import torch

from ascend_patch.ops import grouped_gemm as G
from npu_references import CallLog, reference_npu_grouped_matmul

SIZES = [3, 0, 5, 1]  # an empty group in the middle, as a dispatcher produces when an expert gets no token


def ref(x, weights, sizes, trans_b):
    out, start = [], 0
    for g, n in enumerate(sizes):
        w = weights[g].double()
        out.append(x[start:start + n].double() @ (w.t() if trans_b else w))
        start += n
    return torch.cat(out)


def make(stacked, trans_b, dtype=torch.float32, k=8, n=6):
    shape = (n, k) if trans_b else (k, n)
    x = torch.randn(sum(SIZES), k, dtype=dtype, requires_grad=True)
    if stacked:
        w = torch.randn(len(SIZES), *shape, dtype=dtype, requires_grad=True)
        return x, w, list(w.unbind(0)), (w,)
    ws = [torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in SIZES]
    return x, ws, ws, tuple(ws)


def grads_against_reference(x, weights, mats, params, trans_b, out, atol):
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, *params), g)
    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    mats64 = list(p64[0].unbind(0)) if len(p64) == 1 and p64[0].dim() == 3 else p64
    want = torch.autograd.grad(ref(x64, mats64, SIZES, trans_b), (x64, *p64), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=atol, rtol=atol)


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("trans_b", [False, True])
def test_cpu_path_values_and_grads(seeded, stacked, trans_b):
    x, weights, mats, params = make(stacked, trans_b)
    out = G.grouped_matmul(x, weights, torch.tensor(SIZES), trans_b=trans_b)
    assert out.shape == (9, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref(x, mats, SIZES, trans_b), atol=1e-6, rtol=1e-6)
    grads_against_reference(x, weights, mats, params, trans_b, out, 1e-5)


def test_one_group_given_as_a_list(seeded):
    x, w = torch.randn(5, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)
    out = G.grouped_matmul(x, [w], [5], trans_b=True)
    torch.testing.assert_close(out, x @ w.t())
    out.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(5, 6).t() @ x.detach())


def test_empty_group_gets_a_zero_weight_gradient(seeded):
    x, w, _, _ = make(True, False)
    G.grouped_matmul(x, w, SIZES).sum().backward()
    assert torch.count_nonzero(w.grad[1]) == 0 and torch.count_nonzero(w.grad[0]) > 0


def test_no_rows_at_all(seeded):
    x = torch.zeros(0, 8, requires_grad=True)
    w = torch.randn(4, 8, 6, requires_grad=True)
    out = G.grouped_matmul(x, w, [0, 0, 0, 0])
    assert out.shape == (0, 6)
    out.sum().backward()
    assert torch.count_nonzero(w.grad) == 0 and x.grad.shape == (0, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_stay_16_bit(seeded, dtype):
    x, w, mats, _ = make(True, False, dtype)
    out = G.grouped_matmul(x, w, SIZES)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref(x, mats, SIZES, False), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("trans_b", [False, True])
def test_accumulate_wgrad_adds_into_main_grad(seeded, stacked, trans_b):
    x, weights, mats, params = make(stacked, trans_b)
    for p in params:
        p.main_grad = torch.ones_like(p)
        p.grad_added_to_main_grad = False
    out = G.grouped_matmul(x, weights, SIZES, trans_b=trans_b, accumulate_wgrad=True)
    g = torch.randn_like(out)
    out.backward(g)
    x64 = x.detach().double()
    p64 = [p.detach().double().requires_grad_() for p in params]
    mats64 = list(p64[0].unbind(0)) if stacked else p64
    want = torch.autograd.grad(ref(x64, mats64, SIZES, trans_b), p64, g.double())
    for p, dw in zip(params, want):
        torch.testing.assert_close(p.main_grad.double(), 1 + dw, atol=1e-5, rtol=1e-5)
        assert p.grad_added_to_main_grad is True


def test_bf16_weights_accumulate_into_an_fp32_main_grad_in_fp32(seeded):
    x = torch.randn(9, 8).bfloat16()
    w = torch.randn(4, 8, 6).bfloat16().requires_grad_()
    w.main_grad = torch.zeros(4, 8, 6)
    g = torch.randn(9, 6).bfloat16()
    G.grouped_matmul(x, w, SIZES, accumulate_wgrad=True).backward(g)
    want = torch.zeros(4, 8, 6, dtype=torch.float64)
    start = 0
    for e, n in enumerate(SIZES):
        want[e] = x[start:start + n].double().t() @ g[start:start + n].double()
        start += n
    torch.testing.assert_close(w.main_grad.double(), want, atol=1e-5, rtol=1e-5)  # no bf16 rounding of the sum


def test_errors_say_what_is_wrong():
    x, w = torch.randn(9, 8), torch.randn(4, 8, 6)
    with pytest.raises(ValueError, match=r"sum to 8 but the input has 9 rows"):
        G.grouped_matmul(x, w, [3, 0, 4, 1])
    with pytest.raises(ValueError, match=r"3 group sizes for 4 weights"):
        G.grouped_matmul(x, w, [3, 5, 1])
    with pytest.raises(ValueError, match=r"x has 8 features .* takes 6"):
        G.grouped_matmul(x, w, SIZES, trans_b=True)
    with pytest.raises(ValueError, match=r"x is torch.float32 but the weights are torch.bfloat16"):
        G.grouped_matmul(x, w.bfloat16(), SIZES)


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_npu_translation(target, seeded, stacked, trans_b, dtype):
    log = CallLog(reference_npu_grouped_matmul)
    x, weights, mats, params = make(stacked, trans_b, dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with target.kernels.override(npu_grouped_matmul=log):
        out = G.grouped_matmul(x, weights, torch.tensor(SIZES), trans_b=trans_b)
        torch.testing.assert_close(out.double(), ref(x, mats, SIZES, trans_b), atol=tol, rtol=tol)
        grads_against_reference(x, weights, mats, params, trans_b, out, 1e-5 if dtype == torch.float32 else 1e-1)
    forward, dgrad, wgrad = log.calls
    for call in log.calls:
        assert call["split_item"] == 3 and call["group_list_type"] == 1
        assert call["group_list"].tolist() == SIZES
    assert (forward["group_type"], dgrad["group_type"], wgrad["group_type"]) == (0, 0, 2)
    # per-group weights go in as a list in 16-bit; fp32 takes one stacked weight (the documented cases)
    listed = not stacked and dtype == torch.bfloat16
    assert len(forward["args"][1]) == (len(SIZES) if listed else 1)
    assert wgrad["args"][0][0].shape == ((6, 9) if trans_b else (8, 9))


def test_npu_wgrad_accumulation(target, seeded):
    x, w, mats, _ = make(True, False)
    w.main_grad = torch.zeros_like(w)
    with target.kernels.override(npu_grouped_matmul=reference_npu_grouped_matmul):
        out = G.grouped_matmul(x, w, SIZES, accumulate_wgrad=True)
        g = torch.randn_like(out)
        out.backward(g)
    w64 = w.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(ref(x.detach(), list(w64.unbind(0)), SIZES, False), (w64,), g.double())
    torch.testing.assert_close(w.main_grad.double(), want, atol=1e-5, rtol=1e-5)
