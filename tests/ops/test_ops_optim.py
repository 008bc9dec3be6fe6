"""apex / Transformer Engine fused optimizers against textbook Adam/AdamW/SGD (tests/ops/textbook.py), 10 steps."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from ascend_patch.ops import optim as O
from ascend_patch.unsupported import UnsupportedOption
from textbook import textbook_adam, textbook_sgd

STEPS = 10


def make(dtype=torch.float32, shapes=((5, 7), (13,), (3, 2, 4))):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s).to(dtype)) for s in shapes]
    grads = [[torch.randn(*s).to(dtype) for s in shapes] for _ in range(STEPS)]
    return params, grads


def run(opt, params, grads, steps=STEPS, start=0, grad_attr="grad"):
    for gs in grads[start:start + steps]:
        for p, g in zip(params, gs):
            setattr(p, grad_attr, g.clone())
        opt.step()


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_apex_fused_adam_fp32_matches_textbook(adam_w_mode, bias_correction):
    params, grads = make()
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    opt = O.ApexFusedAdam(params, bias_correction=bias_correction, adam_w_mode=adam_w_mode, weight_decay=0.1, **hp)
    run(opt, params, grads)
    ref_p, ref_m, ref_v = textbook_adam([p.detach() for p in make()[0]], grads, wd=0.1, decoupled=adam_w_mode,
                                        bias_correction=bias_correction, **hp)
    for p, rp, m, rm in zip(params, ref_p, (opt.state[p]["exp_avg"] for p in params), ref_m):
        torch.testing.assert_close(p.detach().double(), rp, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(m.double(), rm, atol=1e-6, rtol=1e-5)
    assert opt.param_groups[0]["step"] == STEPS


def test_apex_fused_adam_bf16_params_keep_fp32_moments():
    params, grads = make(torch.bfloat16)
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    opt = O.ApexFusedAdam(params, weight_decay=0.05, **hp)
    run(opt, params, grads)
    ref_p, ref_m, _ = textbook_adam([p.detach() for p in make(torch.bfloat16)[0]], grads, wd=0.05, decoupled=True,
                                    store=torch.bfloat16, **hp)
    for p, rp, rm in zip(params, ref_p, ref_m):
        assert p.dtype == torch.bfloat16 and opt.state[p]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-2, rtol=1e-2)  # one bf16 rounding per step
        torch.testing.assert_close(opt.state[p]["exp_avg"].double(), rm, atol=1e-6, rtol=1e-5)


def test_apex_fused_adam_equals_torch_adamw_and_state_dict_has_apex_keys():
    params, grads = make()
    opt = O.ApexFusedAdam(params, lr=3e-3, weight_decay=0.01)
    run(opt, params, grads)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in make()[0]]
    ref = torch.optim.AdamW(twin, lr=3e-3, weight_decay=0.01, foreach=False)
    run(ref, twin, grads)
    for p, q in zip(params, twin):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"exp_avg", "exp_avg_sq"}
    assert set(sd["param_groups"][0]) == {"lr", "bias_correction", "betas", "eps", "weight_decay", "step", "params"}
    assert sd["param_groups"][0]["step"] == STEPS


def test_apex_fused_adam_resumes_exactly_from_a_state_dict():
    params, grads = make(torch.bfloat16)
    straight = O.ApexFusedAdam(params, lr=1e-2, weight_decay=0.1)
    run(straight, params, grads)
    resumed_params = make(torch.bfloat16)[0]
    first = O.ApexFusedAdam(resumed_params, lr=1e-2, weight_decay=0.1)
    run(first, resumed_params, grads, steps=5)
    saved = copy.deepcopy(first.state_dict())
    second = O.ApexFusedAdam(resumed_params, lr=1e-2, weight_decay=0.1)
    second.load_state_dict(saved)
    assert second.state[resumed_params[0]]["exp_avg"].dtype == torch.float32  # torch would cast to bf16
    run(second, resumed_params, grads, steps=5, start=5)
    for a, b in zip(params, resumed_params):
        assert torch.equal(a, b)


def test_apex_fused_adam_refusals_and_zero_grad():
    p = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(RuntimeError, match="AMSGrad"):
        O.ApexFusedAdam(p, amsgrad=True)
    with pytest.raises(RuntimeError, match="Master weights is currently only supported with the capturable"):
        O.ApexFusedAdam(p, master_weights=True)
    with pytest.raises(NotImplementedError, match=r"capturable=True\) is for CUDA-graph capture.*capturable=False") as info:
        O.ApexFusedAdam(p, capturable=True)
    assert isinstance(info.value, UnsupportedOption)
    opt = O.ApexFusedAdam(p)
    with pytest.raises(RuntimeError, match="call step\\(\\) with no arguments"):
        opt.step(scale=1.0)
    p[0].grad = torch.ones(3)
    opt.zero_grad()
    assert p[0].grad is None  # set_grad_none=True
    p[0].grad = torch.ones(3)
    O.ApexFusedAdam(p, set_grad_none=False).zero_grad(set_to_none=False)
    assert torch.equal(p[0].grad, torch.zeros(3))


@pytest.mark.parametrize("momentum,dampening,nesterov,wd_after", [
    (0.0, 0.0, False, False), (0.9, 0.0, False, False), (0.9, 0.1, False, True), (0.9, 0.0, True, False)])
def test_apex_fused_sgd_matches_textbook(momentum, dampening, nesterov, wd_after):
    params, grads = make()
    opt = O.ApexFusedSGD(params, lr=0.05, momentum=momentum, dampening=dampening, weight_decay=0.01,
                         nesterov=nesterov, wd_after_momentum=wd_after)
    run(opt, params, grads)
    ref = textbook_sgd([p.detach() for p in make()[0]], grads, lr=0.05, momentum=momentum, dampening=dampening,
                       wd=0.01, nesterov=nesterov, wd_after_momentum=wd_after)
    for p, rp in zip(params, ref):
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-6, rtol=1e-5)
    assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}  # apex keeps a buffer even at momentum 0
    if not wd_after:
        twin = [torch.nn.Parameter(p.detach().clone()) for p in make()[0]]
        torch_sgd = torch.optim.SGD(twin, lr=0.05, momentum=momentum, dampening=dampening, weight_decay=0.01,
                                    nesterov=nesterov)
        run(torch_sgd, twin, grads)
        for p, q in zip(params, twin):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_te_fused_adam_master_weights_and_bf16_moments():
    params, grads = make(torch.bfloat16)
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    opt = O.TEFusedAdam(params, weight_decay=0.1, master_weights=True, exp_avg_dtype=torch.bfloat16,
                        use_decoupled_grad=True, **hp)
    run(opt, params, grads, grad_attr="decoupled_grad")
    ref_p, ref_m, _ = textbook_adam([p.detach() for p in make(torch.bfloat16)[0]], grads, wd=0.1, decoupled=True, **hp)
    for p, rp, rm in zip(params, ref_p, ref_m):
        state = opt.state[p]
        assert state["master_param"].dtype == torch.float32 and state["exp_avg"].dtype == torch.bfloat16
        torch.testing.assert_close(state["master_param"].double(), rp, atol=1e-3, rtol=1e-3)  # bf16 moments
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(state["exp_avg"].double(), rm, atol=1e-2, rtol=1e-2)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"exp_avg", "exp_avg_sq", "master_param"}
    assert all(t.dtype == torch.float32 for s in sd["state"].values() for t in s.values())  # TE saves fp32
    fresh = O.TEFusedAdam(params, master_weights=True, exp_avg_dtype=torch.bfloat16, **hp)
    fresh.load_state_dict(copy.deepcopy(sd))
    assert fresh.state[params[0]]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(fresh.state[params[0]]["master_param"], opt.state[params[0]]["master_param"])


def test_te_fused_adam_fp32_and_refusals():
    params, grads = make()
    opt = O.TEFusedAdam(params, lr=1e-2, weight_decay=0.1, adam_w_mode=False)
    run(opt, params, grads)
    ref_p, _, _ = textbook_adam([p.detach() for p in make()[0]], grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                wd=0.1, decoupled=False)
    for p, rp in zip(params, ref_p):
        torch.testing.assert_close(p.detach().double(), rp, atol=2e-6, rtol=1e-5)
    p = [torch.nn.Parameter(torch.ones(2))]
    for kwargs, match in [(dict(capturable=True), "capturable"), (dict(exp_avg_dtype=torch.float16), "exp_avg_dtype"),
                          (dict(master_weights=True, store_param_remainders=True), "store_param_remainders"),
                          (dict(master_weights=True, master_weight_dtype=torch.float16), "master_weight_dtype")]:
        with pytest.raises(NotImplementedError, match=match):
            O.TEFusedAdam(p, **kwargs)
    mixed = [torch.nn.Parameter(torch.ones(2, dtype=torch.float16)), torch.nn.Parameter(torch.ones(2).bfloat16())]
    opt = O.TEFusedAdam(mixed)
    for q in mixed:
        q.grad = torch.ones_like(q)
    with pytest.raises(RuntimeError, match="mix of float16 and bfloat16"):
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_adamw_fused_runs_on_the_cpu_target(patched, dtype):
    """No gap to fill on cpu: torch 2.13 has fused AdamW there, so no patch is registered for it."""
    from ascend_patch.patching.manager import manager

    assert manager.status_of("torch.optim:Adam.__init__") is None
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(8, 4, device="cuda").to(dtype))]
    start = [a[0].detach().clone()]
    grads = [[torch.randn(8, 4).to(dtype)] for _ in range(STEPS)]
    fused = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    run(fused, a, grads)
    ref, _, _ = textbook_adam(start, grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=0.1, decoupled=True,
                              store=None if dtype == torch.float32 else dtype)
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(a[0].detach().double(), ref[0], **tol)
    assert a[0].device.type == "cpu" and fused.param_groups[0]["fused"] is True


def test_fused_fallback_switches_to_foreach_where_the_kernel_is_missing(monkeypatch):
    def missing(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_fused_adamw_' with arguments from the 'PrivateUse1' backend")

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(6))]
    twin = [torch.nn.Parameter(params[0].detach().clone())]
    monkeypatch.setattr(O, "_PROBED", {})
    monkeypatch.setattr(torch, "_fused_adamw_", missing)
    opt = torch.optim.AdamW.__new__(torch.optim.AdamW)
    with pytest.warns(UserWarning, match=r"no fused kernel for cpu torch.float32; using foreach=True"):
        O.fused_optimizer_fallback(lambda *a, **k: torch.optim.AdamW.__init__(opt, *a, **k), opt, (params,),
                                   dict(lr=1e-2, weight_decay=0.1, fused=True))
    assert opt.param_groups[0]["fused"] is False and opt.param_groups[0]["foreach"] is True
    assert opt._step_supports_amp_scaling is False
    ref = torch.optim.AdamW(twin, lr=1e-2, weight_decay=0.1, foreach=True)
    for _ in range(3):
        g = torch.randn(6)
        params[0].grad, twin[0].grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert torch.equal(params[0], twin[0])
    monkeypatch.undo()
    kept = torch.optim.AdamW.__new__(torch.optim.AdamW)
    O._PROBED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel exists: nothing changes, nothing is said
        O.fused_optimizer_fallback(lambda *a, **k: torch.optim.AdamW.__init__(kept, *a, **k), kept, (twin,),
                                   dict(lr=1e-2, fused=True))
    assert kept.param_groups[0]["fused"] is True


def test_the_fused_fallback_patch_is_registered_for_npu_only():
    import types

    from ascend_patch.ops import plugin

    patches = plugin.ascend_patch_register_patches(backend=types.SimpleNamespace(name="npu", kernels=None))
    (patch,) = [p for p in patches if p.target == "torch.optim:Adam.__init__"]
    assert patch.backends == frozenset({"npu"}) and patch.wrapper is O.fused_optimizer_fallback


def test_te_fused_adam_refuses_amsgrad():
    with pytest.raises(RuntimeError, match="does not support the AMSGrad variant.*torch.optim.Adam\\(amsgrad=True\\)"):
        O.TEFusedAdam([torch.nn.Parameter(torch.ones(2))], amsgrad=True)


@pytest.mark.parametrize("momentum,dampening,nesterov,wd_after", [
    (0.9, 0.0, False, False), (0.9, 0.1, False, True), (0.9, 0.0, True, False)])
def test_te_fused_sgd_matches_textbook(momentum, dampening, nesterov, wd_after):
    params, grads = make()
    opt = O.TEFusedSGD(params, lr=0.05, momentum=momentum, dampening=dampening, weight_decay=0.01,
                       nesterov=nesterov, wd_after_momentum=wd_after)
    run(opt, params, grads)
    ref = textbook_sgd([p.detach() for p in make()[0]], grads, lr=0.05, momentum=momentum, dampening=dampening,
                       wd=0.01, nesterov=nesterov, wd_after_momentum=wd_after)
    for p, rp in zip(params, ref):
        torch.testing.assert_close(p.detach().double(), rp, atol=1e-6, rtol=1e-5)
    with pytest.warns(DeprecationWarning, match="set_grad_none kwarg in FusedSGD constructor is deprecated"):
        O.TEFusedSGD(params, lr=0.1, set_grad_none=True)
    with pytest.raises(TypeError):
        O.TEFusedSGD(params, 0.1, 0.9, 0.0, 0.0, False, True)  # TE's extras are keyword-only


@pytest.mark.parametrize("cls", [O.ApexFusedAdam, O.ApexFusedSGD])
@pytest.mark.parametrize("set_grad_none", [True, False])
def test_apex_zero_grad_follows_set_grad_none(monkeypatch, cls, set_grad_none):
    """apex: set_grad_none sets grads to None itself; False hands over to torch's zero_grad() (its defaults)."""
    calls = []
    torch_zero_grad = torch.optim.Optimizer.zero_grad

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return torch_zero_grad(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", spy)
    p = [torch.nn.Parameter(torch.ones(3))]
    opt = cls(p, lr=0.1, set_grad_none=set_grad_none)
    p[0].grad = torch.ones(3)
    opt.zero_grad()
    if set_grad_none:
        assert calls == [] and p[0].grad is None
    else:
        assert calls == [((), {})]  # apex calls super().zero_grad() with torch's defaults (set_to_none=True)
        assert p[0].grad is None
    p[0].grad = torch.ones(3)
    opt.zero_grad(set_to_none=False)  # an explicit argument always reaches torch
    assert torch.equal(p[0].grad, torch.zeros(3))
