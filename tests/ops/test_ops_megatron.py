"""megatron-core 0.16 with its fusion flags on: the fused-op entry points run the target's implementations."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from helpers import child_env

CHILD = os.path.join(os.path.dirname(__file__), "megatron_fused_child.py")
STOCK = {
    "megatron.core.fusions.fused_bias_swiglu": "bias_swiglu_impl",
    "megatron.core.fusions.fused_bias_gelu": "bias_gelu_impl",
    "megatron.core.models.common.embeddings.rope_utils": "fused_apply_rotary_pos_emb",
}


def test_fused_megatron_gpt_equals_the_unfused_one_and_trains():
    proc = subprocess.run([sys.executable, CHILD], capture_output=True, text=True, timeout=600, cwd="/tmp",
                          env=child_env(ASCEND_PATCH_DEVICE="cpu", ASCEND_PATCH_REPORT="1",
                                        MASTER_PORT=str(29500 + os.getpid() % 400)))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    r = json.loads(lines[0][len("RESULT "):])
    # megatron sees both shims (the transformer_engine one is the TE layer its TE spec builds on); the local
    # spec still picks apex's norm, and the optimizer is TE's FusedAdam, which megatron prefers to apex's
    assert r["have_te"] is True and r["have_apex"] is True
    assert r["ln_impl"] == "megatron.core.fusions.fused_layer_norm.FusedLayerNorm"
    assert r["rope_fused_is_adapted"] and r["mlp_swiglu_is_patched"]
    assert r["l2norm"] == "ascend_patch.ops.multi_tensor"
    assert r["optimizer"] == "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"
    assert r["te_shim_class"] == "transformer_engine.pytorch.optimizers.fused_adam"
    # fp32: the fused RoPE and bias-SwiGLU compute what megatron's unfused path computes
    assert r["fp32_max_diff"] < 1e-5
    assert r["bf16_max_diff"] < 5e-2  # bf16 adds the fused softmax kernel semantics and fp32 RoPE math
    assert r["grads_finite"] and r["step_ok"] and r["params_moved"] and r["grad_norm"] > 0
    uses = r["uses"]  # each fused entry point really ran (2 layers; q and k for RoPE)
    assert uses["megatron.core.models.common.embeddings.rope_utils.fused_apply_rotary_pos_emb"] == 8
    assert uses["megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl"] == 4
    assert uses["megatron.core.fusions.fused_softmax.FusedScaleMaskSoftmax.forward_fused_softmax"] == 2


def test_megatron_entry_points_are_patched_and_restored_by_identity(cpu_settings):
    import importlib

    import ascend_patch
    from ascend_patch.patching.manager import manager

    modules = {name: importlib.import_module(name) for name in STOCK}
    from megatron.core.fusions import fused_softmax

    before = {name: getattr(mod, STOCK[name]) for name, mod in modules.items()}
    before_avail = fused_softmax.FusedScaleMaskSoftmax.__dict__["is_kernel_available"]
    ascend_patch.apply(cpu_settings)
    try:
        for name, mod in modules.items():
            now = getattr(mod, STOCK[name])
            assert now is not before[name] and now.__module__.startswith("ascend_patch"), name
            status = manager.status_of(f"{name}:{STOCK[name]}")
            assert status.state == "applied" and status.patch.package is None  # every release needs it
        x, bias = torch.randn(2, 3, 8, requires_grad=True), torch.randn(8)
        out = modules["megatron.core.fusions.fused_bias_swiglu"].bias_swiglu_impl(x, bias)
        a, b = (x + bias).chunk(2, -1)
        torch.testing.assert_close(out, torch.nn.functional.silu(a) * b)
    finally:
        ascend_patch.remove()
    for name, mod in modules.items():
        assert getattr(mod, STOCK[name]) is before[name]
    assert fused_softmax.FusedScaleMaskSoftmax.__dict__["is_kernel_available"] is before_avail


def test_a_patch_the_release_does_not_need_is_not_needed_and_never_fatal(monkeypatch):
    """On a release without GroupedMLP (0.17.1 as the gate reads it) its patches say so; strict still runs."""
    import importlib

    import ascend_patch
    from ascend_patch.adaptors.megatron import plugin
    from ascend_patch.adaptors.megatron.detect import FoundMegatron
    from ascend_patch.config import Settings
    from ascend_patch.patching.manager import manager

    monkeypatch.setattr(plugin, "find_megatron", lambda: FoundMegatron("0.17.1", "/x/megatron/core", "checkout"))
    importlib.import_module("megatron.core.transformer.moe.experts")
    from ascend_patch.plugins import PluginManager, reset_plugin_manager

    previous = reset_plugin_manager(PluginManager(entry_points=False))
    ascend_patch.apply(Settings(device="cpu", strict=True))
    try:
        status = manager.status_of("megatron.core.transformer.moe.experts:GroupedMLP.forward")
        assert status.state == "skipped" and status.detail == "not needed on megatron-core 0.17.1 (needed on <0.17)"
        assert manager.status_of("megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl").state != "skipped"
    finally:
        ascend_patch.remove()
        reset_plugin_manager(previous)
