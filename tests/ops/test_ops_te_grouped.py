"""transformer_engine.pytorch.GroupedLinear (ascend_patch.adaptors.megatron.te.grouped) against one F.linear per expert."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from npu_references import CallLog, reference_npu_grouped_matmul

SPLITS = [3, 0, 4, 2]


@pytest.fixture
def te(patched):
    spec = importlib.util.find_spec("transformer_engine")
    if spec is not None and not str(spec.origin).startswith("ascend_patch shim"):
        pytest.skip("transformer_engine is really installed here")
    import transformer_engine.pytorch as tep

    return tep


def per_expert(x, weights, biases=None):
    outs, start = [], 0
    for e, n in enumerate(SPLITS):
        outs.append(F.linear(x[start:start + n].double(), weights[e].double(),
                             None if biases is None else biases[e].double()))
        start += n
    return torch.cat(outs)


def test_values_and_grads_with_bias(te, seeded):
    layer = te.GroupedLinear(4, 8, 6, bias=True, init_method=torch.nn.init.normal_)
    for i in range(4):
        getattr(layer, f"bias{i}").data.normal_()
    x = torch.randn(9, 8, requires_grad=True)
    out = layer(x, SPLITS)
    torch.testing.assert_close(out.double(), per_expert(x, layer.weights, layer.biases), atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, *layer.weights, *layer.biases), g)
    x64 = x.detach().double().requires_grad_()
    w64 = [w.detach().double().requires_grad_() for w in layer.weights]
    b64 = [b.detach().double().requires_grad_() for b in layer.biases]
    want = torch.autograd.grad(per_expert(x64, w64, b64), (x64, *w64, *b64), g.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(got[1 + 1]) == 0 and torch.count_nonzero(got[1 + 4 + 1]) == 0  # expert 1: no token


def test_return_bias_keeps_the_bias_out_and_the_leading_shape(te, seeded):
    layer = te.GroupedLinear(4, 8, 6, bias=True, return_bias=True)
    x = torch.randn(9, 1, 8)
    out, biases = layer(x, SPLITS)
    assert out.shape == (9, 1, 6) and len(biases) == 4
    torch.testing.assert_close(out.view(9, 6).double(), per_expert(x.view(9, 8), layer.weights), atol=1e-5,
                               rtol=1e-5)
    assert all(torch.equal(b, getattr(layer, f"bias{i}")) for i, b in enumerate(biases))


def test_parameters_state_dict_and_tags_as_te(te, seeded):
    layer = te.GroupedLinear(3, 8, 6, bias=False, parallel_mode="row")
    assert [n for n, _ in layer.named_parameters()] == ["weight0", "weight1", "weight2"]
    assert layer.bias0.numel() == 0  # TE's "no bias"
    assert set(layer.state_dict()) == {"weight0", "weight1", "weight2", "_extra_state"}
    assert layer.weight2.tensor_model_parallel and layer.weight2.partition_dim == 1
    assert (layer.fp8, layer.fp8_calibration, layer.fp8_meta["fp8_checkpoint"]) == (False, False, False)


def test_init_draws_each_weight_from_the_tracker_in_order(te):
    import transformer_engine.pytorch.distributed as ted

    tracker = ted.CudaRNGStatesTracker()
    tracker.add("expert-parallel-rng", 99)
    layer = te.GroupedLinear(3, 4, 5, init_method=torch.nn.init.normal_, get_rng_state_tracker=lambda: tracker,
                             rng_tracker_name="expert-parallel-rng")
    state = torch.get_rng_state()
    torch.manual_seed(99)
    want = [torch.nn.init.normal_(torch.empty(5, 4)) for _ in range(3)]
    torch.set_rng_state(state)
    for w, expected in zip(layer.weights, want):
        assert torch.equal(w.detach(), expected)


def test_fused_wgrad_accumulation(te, seeded):
    layer = te.GroupedLinear(4, 8, 6, bias=False, fuse_wgrad_accumulation=True)
    x = torch.randn(9, 8)
    with pytest.raises(RuntimeError, match=r"weights \[0, 1, 2, 3\] have no main_grad.*gradient-accumulation-fusion"):
        layer(x, SPLITS)
    for w in layer.weights:
        w.main_grad = torch.zeros_like(w)
        w.grad_added_to_main_grad = False
    out = layer(x, SPLITS)
    g = torch.randn_like(out)
    out.backward(g)
    w64 = [w.detach().double().requires_grad_() for w in layer.weights]
    want = torch.autograd.grad(per_expert(x, w64), w64, g.double())
    for w, dw in zip(layer.weights, want):
        torch.testing.assert_close(w.main_grad.double(), dw, atol=1e-5, rtol=1e-5)
        assert w.grad_added_to_main_grad is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_npu_path(te, seeded, dtype):
    import ascend_patch

    layer = te.GroupedLinear(4, 8, 6, bias=False, params_dtype=dtype)
    x = torch.randn(9, 8, dtype=dtype, requires_grad=True)
    want = per_expert(x, layer.weights)
    log = CallLog(reference_npu_grouped_matmul)
    with ascend_patch.active_backend().kernels.override(npu_grouped_matmul=log):
        out = layer(x, SPLITS)
        out.sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    assert [c["group_type"] for c in log.calls] == [0, 0, 2]
    # bf16: one weight per expert, passed transposed as they are; fp32 only as one stacked weight
    assert len(log.calls[0]["args"][1]) == (4 if dtype == torch.bfloat16 else 1)
    assert log.calls[0]["group_list"].tolist() == SPLITS


def test_refusals(te):
    with pytest.raises(NotImplementedError, match=r"delay_wgrad_compute=True.*--delay-wgrad-compute"):
        te.GroupedLinear(2, 8, 8, delay_wgrad_compute=True)
    with pytest.raises(NotImplementedError, match=r"parallel_mode='column', tp_size=2.*--expert-tensor-parallel-size"):
        te.GroupedLinear(2, 8, 8, parallel_mode="column", tp_size=2)
    with pytest.raises(ValueError, match=r"3 splits for 2 GEMMs"):
        te.GroupedLinear(2, 8, 8)(torch.randn(3, 8), [1, 1, 1])
