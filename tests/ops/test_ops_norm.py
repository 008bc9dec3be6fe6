"""apex.normalization and fused_layer_norm_cuda against the norm formulas written here, and the npu path."""

from __future__ import annotations

import pytest
import torch

from ascend_patch.ops import norm as N
from ascend_patch.ops import norm_apex as NA
from npu_references import CallLog, reference_npu_rms_norm

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def ref_layer_norm(x, w, b, eps, dims=1):
    x64 = x.double()
    axes = tuple(range(-dims, 0))
    mean = x64.mean(axes, keepdim=True)
    var = ((x64 - mean) ** 2).mean(axes, keepdim=True)
    y = (x64 - mean) / torch.sqrt(var + eps)
    return y * w.double() + b.double() if w is not None else y


def ref_rms_norm(x, w, eps, dims=1):
    x64 = x.double()
    y = x64 / torch.sqrt((x64 ** 2).mean(tuple(range(-dims, 0)), keepdim=True) + eps)
    return y * w.double() if w is not None else y


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_fused_layer_norm_values_and_grads(seeded, dtype, memory_efficient):
    m = NA.FusedLayerNorm(24, eps=1e-5, memory_efficient=memory_efficient).to(dtype)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_()
    x = torch.randn(3, 5, 24).to(dtype).requires_grad_()
    out = m(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_layer_norm(x, m.weight, m.bias, 1e-5), **TOL[dtype])
    g = torch.randn_like(out)
    got = _grads(out, (x, m.weight, m.bias), g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, m.weight, m.bias))
    want = _grads(ref_layer_norm(x64, w64, b64, 1e-5), (x64, w64, b64), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-4 if dtype == torch.float32 else 2e-1,
                                   rtol=1e-4 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_fused_rms_norm_values_and_grads(seeded, dtype, memory_efficient):
    m = NA.FusedRMSNorm((4, 6), eps=1e-6, memory_efficient=memory_efficient).to(dtype)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    x = torch.randn(7, 4, 6).to(dtype).requires_grad_()
    out = m(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_rms_norm(x, m.weight, 1e-6, dims=2), **TOL[dtype])
    g = torch.randn_like(out)
    got = _grads(out, (x, m.weight), g)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, m.weight))
    want = _grads(ref_rms_norm(x64, w64, 1e-6, dims=2), (x64, w64), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-4 if dtype == torch.float32 else 2e-1,
                                   rtol=1e-4 if dtype == torch.float32 else 5e-2)


def test_mixed_variants_output_in_the_weight_dtype(seeded):
    x = torch.randn(4, 16).bfloat16().requires_grad_()
    ln, rms = NA.MixedFusedLayerNorm(16), NA.MixedFusedRMSNorm(16)
    assert ln.weight.dtype == torch.float32
    y_ln, y_rms = ln(x), rms(x)
    assert y_ln.dtype == torch.float32 and y_rms.dtype == torch.float32
    torch.testing.assert_close(y_ln.double(), ref_layer_norm(x, ln.weight, ln.bias, 1e-5), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y_rms.double(), ref_rms_norm(x, rms.weight, 1e-5), atol=1e-5, rtol=1e-5)
    (y_ln.sum() + y_rms.sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and ln.weight.grad.dtype == torch.float32
    with pytest.warns(UserWarning, match="elementwise_affine"), \
            pytest.raises(RuntimeError, match="does not support `elementwise_affine = False`"):
        NA.MixedFusedRMSNorm(16, elementwise_affine=False)


def test_non_affine_forms_and_state_dict_keys(seeded):
    x = torch.randn(3, 8)
    torch.testing.assert_close(N.fused_layer_norm(x, 8, 1e-5).double(), ref_layer_norm(x, None, None, 1e-5))
    torch.testing.assert_close(N.fused_rms_norm(x, 8, 1e-5).double(), ref_rms_norm(x, None, 1e-5))
    assert set(NA.FusedRMSNorm(8).state_dict()) == set(torch.nn.RMSNorm(8).state_dict()) == {"weight"}
    assert set(NA.FusedLayerNorm(8).state_dict()) == set(torch.nn.LayerNorm(8).state_dict())


def test_autocast_casts_like_apex(seeded):
    m = NA.FusedLayerNorm(8)
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x).dtype == torch.bfloat16  # apex casts inputs to the autocast dtype, then runs without it


def test_fused_layer_norm_cuda_functions(seeded):
    from ascend_patch.ops import norm_cuda

    fns = {name: getattr(norm_cuda, name) for name in norm_cuda.__all__}  # fused_layer_norm_cuda's functions
    x = torch.randn(6, 10).bfloat16()
    w, b = torch.rand(10) + 0.5, torch.randn(10)
    out, mean, invvar = fns["forward_affine"](x, [10], w, b, 1e-5)
    assert out.dtype == torch.bfloat16 and mean.shape == (6,) and mean.dtype == invvar.dtype == torch.float32
    torch.testing.assert_close(mean.double(), x.double().mean(-1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(invvar.double(), 1 / torch.sqrt(x.double().var(-1, unbiased=False) + 1e-5),
                               atol=1e-4, rtol=1e-4)
    assert fns["forward_affine_mixed_dtypes"](x, [10], w, b, 1e-5)[0].dtype == torch.float32
    y, rstd = fns["rms_forward_affine"](x.float(), [10], w, 1e-5)
    torch.testing.assert_close(y.double(), ref_rms_norm(x.float(), w, 1e-5), atol=1e-5, rtol=1e-5)
    xf = x.float().requires_grad_()
    wf, bf = w.clone().requires_grad_(), b.clone().requires_grad_()
    g = torch.randn(6, 10)
    want = torch.autograd.grad(torch.nn.functional.layer_norm(xf, (10,), wf, bf, 1e-5), (xf, wf, bf), g)
    o, mu, iv = fns["forward_affine"](xf.detach(), [10], w, b, 1e-5)
    for efficient, saved in ((False, xf.detach()), (True, o)):
        got = fns["backward_affine"](g, None if efficient else mu, iv, saved, [10], w, b, 1e-5, efficient)
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
    want_rms = torch.autograd.grad(torch.nn.functional.rms_norm(xf, (10,), wf, 1e-5), (xf, wf), g)
    yr, ir = fns["rms_forward_affine"](xf.detach(), [10], w, 1e-5)
    for efficient, saved in ((False, xf.detach()), (True, yr)):
        got = fns["rms_backward_affine"](g, ir, saved, [10], w, 1e-5, efficient)
        for a, c in zip(got, want_rms):
            torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)


def test_megatron_style_affine_function_signature():
    import inspect

    assert "memory_efficient" in inspect.getfullargspec(N.FusedLayerNormAffineFunction.forward).args
    assert "memory_efficient" in inspect.getfullargspec(N.FastLayerNormFN.forward).args
    x, w, b = torch.randn(4, 8, requires_grad=True), torch.ones(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    y = N.FastLayerNormFN.apply(x, w, b, 1e-5, False)
    torch.testing.assert_close(y.double(), ref_layer_norm(x, w, b, 1e-5), atol=1e-5, rtol=1e-5)
    y.sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32)])
def test_npu_rms_norm_translation(target, seeded, x_dtype, w_dtype):
    log = CallLog(reference_npu_rms_norm)
    x = torch.randn(2, 3, 16).to(x_dtype)
    w = (torch.rand(16) + 0.5).to(w_dtype)
    with target.kernels.override(npu_rms_norm=log):
        out = N.rms_norm(x, 16, w, 1e-6)
        mixed = N.rms_norm(x, 16, w, 1e-6, out_dtype=w_dtype)
        module = NA.FusedRMSNorm(16, eps=1e-6).to(w_dtype)
        module(x)
    assert len(log.calls) == 3 and all(c["epsilon"] == 1e-6 for c in log.calls)
    assert out.dtype == x_dtype and mixed.dtype == w_dtype
    tol = TOL[torch.bfloat16 if torch.bfloat16 in (x_dtype, w_dtype) else torch.float32]
    torch.testing.assert_close(out.double(), ref_rms_norm(x, w, 1e-6), **tol)
    torch.testing.assert_close(mixed.double(), ref_rms_norm(x, w, 1e-6), **tol)
