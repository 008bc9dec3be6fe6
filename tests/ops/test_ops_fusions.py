"""SwiGLU / bias-SwiGLU / bias-GeLU and the fused scale-mask-softmax against formulas written here."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_patch.adaptors.megatron import fusions as F
from ascend_patch.ops import softmax as S
from ascend_patch.ops import swiglu as W
from npu_references import CallLog, reference_npu_scaled_masked_softmax, reference_npu_swiglu


def ref_swiglu(y):
    a, b = y.double().chunk(2, -1)
    return a / (1 + torch.exp(-a)) * b


def ref_tanh_gelu(x):
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_clamped_swiglu(y, c):
    """megatron-core main's clamped SwiGLU, written out: the gate clamped from above, the linear half both ways."""
    a, b = y.double().chunk(2, -1)
    a, b = torch.where(a > c, torch.full_like(a, c), a), torch.where(b.abs() > c, b.sign() * c, b)
    return a / (1 + torch.exp(-a)) * b


@pytest.mark.parametrize("with_bias", [True, False])
def test_main_s_clamped_bias_swiglu_takes_clamp_value_as_its_fifth_argument(seeded, with_bias):
    x = (3 * torch.randn(3, 2, 16)).requires_grad_()  # values past the clamp on both sides
    bias = torch.randn(16, requires_grad=True) if with_bias else None
    out = F.bias_swiglu_impl(x, bias, False, False, 1.5)  # main's MLP passes it positionally
    y = x + bias if with_bias else x
    torch.testing.assert_close(out.double(), ref_clamped_swiglu(y, 1.5), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out.double(), ref_swiglu(y))  # the clamp changed something
    g = torch.randn_like(out)
    inputs = (x, bias) if with_bias else (x,)
    got = torch.autograd.grad(out, inputs, g)
    x64 = x.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if with_bias else None
    want = torch.autograd.grad(ref_clamped_swiglu(x64 + b64 if with_bias else x64, 1.5),
                               (x64, b64) if with_bias else (x64,), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception, match="--activation-func-fp8-input-store"):
        F.bias_swiglu_impl(x, bias, True, False, 1.5)


@pytest.mark.parametrize("shape", [(6, 16), (3, 2, 16)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_swiglu_impl_values_and_grads(seeded, shape, with_bias):
    impl = F.bias_swiglu_impl
    x = torch.randn(*shape, requires_grad=True)
    bias = torch.randn(16, requires_grad=True) if with_bias else None
    out = impl(x, bias)
    assert out.shape == (*shape[:-1], 8)
    torch.testing.assert_close(out.double(), ref_swiglu(x + bias if with_bias else x), atol=1e-6, rtol=1e-6)
    g = torch.randn_like(out)
    inputs = (x, bias) if with_bias else (x,)
    got = torch.autograd.grad(out, inputs, g)
    x64 = x.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if with_bias else None
    ref_in = (x64, b64) if with_bias else (x64,)
    want = torch.autograd.grad(ref_swiglu(x64 + b64 if with_bias else x64), ref_in, g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


def test_fp8_input_store_and_offload_tags(seeded):
    x = torch.randn(4, 16, requires_grad=True)
    bias = torch.randn(16, requires_grad=True)
    out = W.bias_swiglu(x, bias, fp8_input_store=True, cpu_offload_input=True)
    torch.testing.assert_close(out.double(), ref_swiglu(x + bias), atol=1e-6, rtol=1e-6)  # forward is exact
    assert getattr(bias, "activation_offloading", False) is True
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, (x,), g)
    rounded = x.detach().to(torch.float8_e4m3fn).double().requires_grad_()  # backward sees the fp8 copy
    (want,) = torch.autograd.grad(ref_swiglu(rounded + bias.detach().double()), (rounded,), g.double())
    torch.testing.assert_close(dx.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fp8_input_store", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
def test_cpu_offload_input_tags_the_saved_input(seeded, fp8_input_store, with_bias):
    """megatron's activation offloading packs the saved tensors tagged ``activation_offloading``: the input kept
    for backward (as megatron keeps it: fp8 copy or the input) must carry the tag, not only the bias."""
    x = torch.randn(4, 16, requires_grad=True)
    bias = torch.randn(16, requires_grad=True) if with_bias else None
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.bias_swiglu_impl(x, bias, fp8_input_store, True)
    tagged = [t for t in packed if getattr(t, "activation_offloading", False)]
    inputs = [t for t in tagged if t.shape == x.shape]
    assert len(inputs) == 1
    saved = inputs[0]
    if fp8_input_store:
        assert saved.dtype == torch.float8_e4m3fn and torch.equal(saved, x.detach().to(torch.float8_e4m3fn))
    else:  # the input, or input + bias (what backward needs; megatron saves the input and the bias)
        torch.testing.assert_close(saved, (x + bias if with_bias else x).detach(), atol=0, rtol=0)
    if with_bias:
        assert bias.activation_offloading is True
    plain = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: plain.append(t) or t, lambda t: t):
        F.bias_swiglu_impl(torch.randn(4, 16, requires_grad=True), None, fp8_input_store, False)
    assert plain and not any(getattr(t, "activation_offloading", False) for t in plain)
    out.sum().backward()
    assert x.grad is not None


def test_bias_gelu_impl_is_megatrons_tanh_gelu(seeded):
    impl = F.bias_gelu_impl
    x, bias = torch.randn(5, 12, requires_grad=True), torch.randn(12, requires_grad=True)
    out = impl(x, bias)
    torch.testing.assert_close(out.double(), ref_tanh_gelu(x + bias), atol=1e-6, rtol=1e-6)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, bias), g)
    x64, b64 = x.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    want = torch.autograd.grad(ref_tanh_gelu(x64 + b64), (x64, b64), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


def test_npu_swiglu_translation(target, seeded):
    log = CallLog(reference_npu_swiglu)
    x, bias = torch.randn(2, 3, 16), torch.randn(16)
    with target.kernels.override(npu_swiglu=log):
        out = F.bias_swiglu_impl(x, bias)
        kept = W.bias_swiglu(x.view(-1, 16), bias, fp8_input_store=True)  # needs our autograd
    assert len(log.calls) == 1 and log.calls[0]["dim"] == -1
    torch.testing.assert_close(out.double(), ref_swiglu(x + bias), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kept.double(), ref_swiglu(x.view(-1, 16) + bias), atol=1e-6, rtol=1e-6)


def ref_masked_softmax(x, mask, scale):
    """Megatron's fused kernels: masked -> -10000, fp32 softmax, fully masked rows -> 0."""
    y = (x.double() * scale).masked_fill(mask, -10000.0)
    p = torch.softmax(y, -1)
    return p.masked_fill(mask.all(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scaled_masked_softmax_semantics(seeded, dtype):
    x = torch.randn(2, 3, 8, 8).to(dtype)
    mask = torch.rand(2, 1, 8, 8) < 0.3
    mask[0, 0, 2] = True  # a fully masked row
    out = S.scaled_masked_softmax(x, mask, 0.5)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_masked_softmax(x, mask, 0.5), atol=5e-3, rtol=1e-2)
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    causal = S.scaled_masked_softmax(x, None, 2.0, causal=True)
    tri = torch.ones(8, 8, dtype=torch.bool).triu(1)
    torch.testing.assert_close(causal.double(), ref_masked_softmax(x, tri.expand(2, 3, 8, 8), 2.0), atol=5e-3,
                               rtol=1e-2)


def test_megatron_fused_scale_mask_softmax_uses_the_adapted_kernel(patched, seeded):
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    from ascend_patch.patching.manager import manager

    for name in ("is_kernel_available", "forward_fused_softmax"):
        status = manager.status_of(f"megatron.core.fusions.fused_softmax:FusedScaleMaskSoftmax.{name}")
        assert status is not None and status.state == "applied"
    causal = FusedScaleMaskSoftmax(False, True, AttnMaskType.causal, True, attention_mask_func, True, None)
    padded = FusedScaleMaskSoftmax(False, True, AttnMaskType.padding, True, attention_mask_func, True, 0.25)
    x = torch.randn(2, 4, 32, 32).bfloat16()
    assert causal.is_kernel_available(None, 2, 4, 32, 32)  # the stock method raises here (no CUDA extension)
    tri = torch.ones(32, 32, dtype=torch.bool).triu(1)
    torch.testing.assert_close(causal(x, None).double(), ref_masked_softmax(x, tri.expand(2, 4, 32, 32), 1.0),
                               atol=5e-3, rtol=1e-2)
    mask = torch.rand(2, 1, 32, 32) < 0.2
    torch.testing.assert_close(padded(x, mask).double(), ref_masked_softmax(x, mask, 0.25), atol=5e-3, rtol=1e-2)
    windowed = FusedScaleMaskSoftmax(False, True, AttnMaskType.causal, True, attention_mask_func, True, None,
                                     window_size=(4, 0))
    assert not windowed.is_kernel_available(None, 2, 4, 32, 32)  # the kernels have no window: torch path
    fp32 = FusedScaleMaskSoftmax(False, False, AttnMaskType.causal, True, attention_mask_func, True, None)
    assert not fp32.is_kernel_available(None, 2, 4, 32, 32)


class Cfg:
    scaled_masked_softmax_fusion, input_in_float16, window_size = True, True, None
    attn_mask_type = type("T", (), {"name": "padding"})()


def test_npu_scaled_masked_softmax_translation(target, seeded):
    log = CallLog(reference_npu_scaled_masked_softmax)
    x = torch.randn(2, 2, 32, 64)
    mask = torch.rand(2, 1, 32, 64) < 0.2
    with target.kernels.override(npu_scaled_masked_softmax=log):
        out = S.scaled_masked_softmax(x, mask, 0.5)
        causal = S.scaled_masked_softmax(torch.randn(1, 2, 64, 64), None, 1.0, causal=True)
        small = S.scaled_masked_softmax(torch.randn(1, 1, 8, 8), None, 1.0)  # under 32: torch
        is_avail = F.is_kernel_available
        answers = (is_avail(Cfg(), None, 1, 1, 64, 64), is_avail(Cfg(), None, 1, 1, 48, 64))
    assert answers == (True, False)  # the documented 32..4096, multiple-of-32 limits
    assert is_avail(Cfg(), None, 1, 1, 48, 64)  # the kernel looked up at call time: cpu takes any shape
    assert len(log.calls) == 2 and log.calls[0]["args"][2:] == (0.5, False)
    torch.testing.assert_close(out.double(), ref_masked_softmax(x, mask, 0.5), atol=1e-6, rtol=1e-6)
    assert torch.equal(causal[..., 0, 1:], torch.zeros_like(causal[..., 0, 1:]))
    torch.testing.assert_close(small.sum(-1), torch.ones(1, 1, 8))
