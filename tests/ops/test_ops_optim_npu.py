"""The fused optimizers' npu path: torch's fused Adam(W) / SGD kernels taken from the backend's kernel table.

References of the kernels' documented semantics (tests/ops/npu_references.py) are injected into the
table; the optimizers' translation (lr, betas, eps, weight decay, Adam vs AdamW, the step count,
first-step momentum) must reproduce textbook Adam / SGD (tests/ops/textbook.py) over 10 steps.
"""

from __future__ import annotations

import types

import pytest
import torch

from ascend_patch.ops import multi_tensor as MT
from ascend_patch.ops import optim as O
from npu_references import CallLog, reference_fused_adam, reference_fused_adamw, reference_fused_sgd
from textbook import textbook_adam, textbook_sgd

STEPS = 10
SHAPES = ((5, 7), (13,), (3, 2, 4))


def make(dtype=torch.float32):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s).to(dtype)) for s in SHAPES]
    grads = [[torch.randn(*s).to(dtype) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def run(opt, params, grads, grad_attr="grad"):
    for gs in grads:
        for p, g in zip(params, gs):
            setattr(p, grad_attr, g.clone())
        opt.step()


def _refuse_torch_kernels(monkeypatch):
    """The table's kernel must be the one called: torch's own ops fail the test if reached."""
    def reached(*args, **kwargs):
        raise AssertionError("torch's own fused kernel was called instead of the kernel table's")

    for name in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_"):
        monkeypatch.setattr(torch, name, reached)


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apex_fused_adam_npu_translation(target, monkeypatch, adam_w_mode, dtype):
    _refuse_torch_kernels(monkeypatch)
    name = "_fused_adamw_" if adam_w_mode else "_fused_adam_"
    log = CallLog(reference_fused_adamw if adam_w_mode else reference_fused_adam)
    params, grads = make(dtype)
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6)
    with target.kernels.override(**{name: log}):
        opt = O.ApexFusedAdam(params, adam_w_mode=adam_w_mode, weight_decay=0.1, **hp)
        run(opt, params, grads)
    store = None if dtype == torch.float32 else dtype
    ref_p, ref_m, ref_v = textbook_adam([p.detach() for p in make(dtype)[0]], grads, wd=0.1, decoupled=adam_w_mode,
                                        store=store, **hp)
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for p, rp, rm, rv in zip(params, ref_p, ref_m, ref_v):
        torch.testing.assert_close(p.detach().double(), rp, **tol)
        torch.testing.assert_close(opt.state[p]["exp_avg"].double(), rm, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"].double(), rv, atol=1e-6, rtol=1e-5)
    assert len(log.calls) == STEPS
    for step, call in enumerate(log.calls, start=1):
        assert (call["lr"], call["beta1"], call["beta2"], call["eps"], call["weight_decay"]) == (1e-2, 0.9, 0.99,
                                                                                                  1e-6, 0.1)
        assert call["amsgrad"] is False and call["maximize"] is False
        steps = call["args"][5]
        assert [float(s) for s in steps] == [float(step)] * len(SHAPES)
        # bf16 params with apex's fp32 moments: the kernel updates fp32 copies of the params
        assert {t.dtype for t in call["args"][0]} == {torch.float32}


def test_no_bias_correction_takes_the_foreach_path(target, monkeypatch):
    """torch's fused kernels always bias-correct: bias_correction=False must not call them."""
    _refuse_torch_kernels(monkeypatch)
    log = CallLog(reference_fused_adamw)
    params, grads = make()
    with target.kernels.override(_fused_adamw_=log):
        opt = O.ApexFusedAdam(params, lr=1e-2, bias_correction=False, weight_decay=0.1)
        run(opt, params, grads)
    ref_p, _, _ = textbook_adam([p.detach() for p in make()[0]], grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                wd=0.1, decoupled=True, bias_correction=False)
    assert log.calls == []
    for p, rp in zip(params, ref_p):
        torch.testing.assert_close(p.detach().double(), rp, atol=2e-6, rtol=1e-5)


def test_te_fused_adam_master_weights_npu_translation(target, monkeypatch):
    _refuse_torch_kernels(monkeypatch)
    log = CallLog(reference_fused_adamw)
    params, grads = make(torch.bfloat16)
    with target.kernels.override(_fused_adamw_=log):
        opt = O.TEFusedAdam(params, lr=1e-2, weight_decay=0.1, master_weights=True)
        run(opt, params, grads)
    ref_p, _, _ = textbook_adam([p.detach() for p in make(torch.bfloat16)[0]], grads, lr=1e-2, betas=(0.9, 0.999),
                                eps=1e-8, wd=0.1, decoupled=True)
    assert len(log.calls) == STEPS
    for p, rp in zip(params, ref_p):
        master = opt.state[p]["master_param"]
        assert any(master is t for t in log.calls[-1]["args"][0])  # the fp32 masters are what the kernel updates
        torch.testing.assert_close(master.double(), rp, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("momentum,dampening,nesterov", [(0.0, 0.0, False), (0.9, 0.1, False), (0.9, 0.0, True)])
def test_apex_fused_sgd_npu_translation(target, monkeypatch, momentum, dampening, nesterov):
    _refuse_torch_kernels(monkeypatch)
    log = CallLog(reference_fused_sgd)
    params, grads = make()
    with target.kernels.override(_fused_sgd_=log):
        opt = O.ApexFusedSGD(params, lr=0.05, momentum=momentum, dampening=dampening, weight_decay=0.01,
                             nesterov=nesterov)
        run(opt, params, grads)
    ref = textbook_sgd([p.detach() for p in make()[0]], grads, lr=0.05, momentum=momentum, dampening=dampening,
                       wd=0.01, nesterov=nesterov)
    for p, rp in zip(params, ref):
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-6, rtol=1e-5)
    assert len(log.calls) == STEPS
    first = [c["is_first_step"] for c in log.calls]
    assert first == ([True] + [False] * (STEPS - 1) if momentum else [False] * STEPS)
    for call in log.calls:
        assert (call["lr"], call["momentum"], call["dampening"], call["weight_decay"]) == (0.05, momentum, dampening,
                                                                                        0.01)
        assert call["nesterov"] is nesterov and call["grad_scale"] is None and call["found_inf"] is None


def test_amp_scale_and_wd_after_momentum_stay_off_the_kernel(target, monkeypatch):
    """torch's SGD kernel unscales grads in place and decays before the momentum: apex differs in both."""
    _refuse_torch_kernels(monkeypatch)
    log = CallLog(reference_fused_sgd)
    params, grads = make()
    with target.kernels.override(_fused_sgd_=log):
        opt = O.ApexFusedSGD(params, lr=0.05, momentum=0.9, weight_decay=0.01, wd_after_momentum=True)
        run(opt, params, grads)
        w, g, m = [torch.ones(3)], [torch.full((3,), 2.0)], [torch.zeros(3)]
        MT.multi_tensor_sgd(2048, torch.zeros(1, dtype=torch.int), [g, w, m], 0.0, 0.9, 0.0, 0.1, False, True,
                            False, 0.5)
    assert log.calls == []
    ref = textbook_sgd([p.detach() for p in make()[0]], grads, lr=0.05, momentum=0.9, dampening=0.0, wd=0.01,
                       nesterov=False, wd_after_momentum=True)
    for p, rp in zip(params, ref):
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-6, rtol=1e-5)
    assert torch.equal(g[0], torch.full((3,), 2.0)) and torch.allclose(w[0], torch.full((3,), 0.9))


def test_without_a_kernel_on_a_device_the_foreach_path_runs(target, monkeypatch):
    """A table without the kernel on a non-host device: no fused call, textbook values (foreach path)."""
    _refuse_torch_kernels(monkeypatch)
    params, grads = make()
    monkeypatch.setattr(MT, "optimizer_kernel", lambda name, device: None)
    opt = O.ApexFusedAdam(params, lr=1e-2, weight_decay=0.1)
    run(opt, params, grads)
    ref_p, _, _ = textbook_adam([p.detach() for p in make()[0]], grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                wd=0.1, decoupled=True)
    for p, rp in zip(params, ref_p):
        torch.testing.assert_close(p.detach().double(), rp, atol=2e-6, rtol=1e-5)


def test_optimizer_kernel_lookup(target):
    host, npu = torch.device("cpu"), torch.device("meta")  # meta stands in for a device torch has no kernel on
    assert MT.optimizer_kernel("_fused_adamw_", host) is torch._fused_adamw_  # cpu: torch's own
    assert MT.optimizer_kernel("_fused_sgd_", host) is torch._fused_sgd_
    assert MT.optimizer_kernel("_fused_adamw_", npu) is None  # not in the table, not the host

    def ref(*a, **k):
        return None

    with target.kernels.override(_fused_adamw_=ref):
        assert MT.optimizer_kernel("_fused_adamw_", npu) is ref


def test_the_npu_table_carries_torchs_fused_optimizer_kernels():
    from ascend_patch import backend as B

    def rms(*a, **k):
        return None

    table = B._npu_kernels(types.SimpleNamespace(npu_rms_norm=rms))
    assert table.get("npu_rms_norm") is rms
    for name in B.NPU_TORCH_KERNEL_NAMES:
        assert table.get(name) is getattr(torch, name)


def test_the_shims_reach_the_current_target(patched):
    """apex / TE optimizers and amp_C's steps from the shims reach the active target's kernel table."""
    import amp_C
    from apex.optimizers import FusedAdam, FusedSGD

    import ascend_patch

    backend = ascend_patch.active_backend()
    adam_log, sgd_log = CallLog(reference_fused_adamw), CallLog(reference_fused_sgd)
    params, grads = make()
    with backend.kernels.override(_fused_adamw_=adam_log, _fused_sgd_=sgd_log):
        run(FusedAdam(params, lr=1e-2), params, grads[:2])
        run(FusedSGD(params, lr=1e-2, momentum=0.9), params, grads[:2])
        w = [torch.randn(4)]
        amp_C.multi_tensor_adam(2048, torch.zeros(1, dtype=torch.int), [[torch.randn(4)], w, [torch.zeros(4)],
                                                                         [torch.zeros(4)]],
                                1e-2, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    assert len(adam_log.calls) == 3 and len(sgd_log.calls) == 2
