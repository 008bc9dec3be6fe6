"""The Megatron adaptor's patches: version ranges, and each patch's behaviour against a reference."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import subprocess
import sys
import types

import pytest
import torch

from ascend_patch.backend import cpu_backend

from helpers import child_env
from mcore_run import mcore_world  # noqa: F401  (fixture)


def _megatron_statuses():
    from ascend_patch.patching.manager import manager

    return [s for s in manager.statuses if s.patch.owner == "megatron"]


def test_a_megatron_patch_names_a_release_range_only_through_a_fact():
    """Every megatron-core patch applies on every release, or on the releases one named fact says need it."""
    from ascend_patch.adaptors.megatron import releases
    from ascend_patch.adaptors.megatron.plugin import megatron_patches
    from ascend_patch.adaptors.megatron.training.plugin import training_patches

    patches = [*megatron_patches(cpu_backend()), *training_patches(cpu_backend())]
    internal = [p for p in patches if p.target.startswith("megatron.")]
    assert len(internal) >= 20
    for patch in internal:
        assert patch.reason and patch.versions is None, patch.target
        assert patch.package is None or (patch.package == "megatron-core" and patch.needed in releases.FACTS.values())
    needed = {p.target: p.needed for p in internal if p.needed}
    assert needed["megatron.core.transformer.moe.experts:GroupedMLP.forward"] == "<0.17"
    assert needed["megatron.legacy.fused_kernels:load"] == "<0.17"
    assert needed["megatron.core.dist_checkpointing.strategies.filesystem_async:_write_item"] == "<0.13"
    assert {p.target for p in patches} >= {
        "megatron.core.jit:jit_fuser",
        "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__",
        "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.fork",
        "fused_weight_gradient_mlp_cuda",
    }


def test_jit_fuser_is_eager_on_the_target_and_torch_compile_only_wrapped(cpu_settings):
    import ascend_patch
    import megatron.core.fusions.fused_bias_gelu as gelu
    import megatron.core.jit as jit

    compiled = gelu.bias_gelu
    assert hasattr(compiled, "_torchdynamo_orig_callable")  # imported before apply: torch.compile'd
    original_compile = torch.compile
    ascend_patch.apply(cpu_settings)
    try:
        from ascend_patch.adaptors.megatron.jit import eager

        assert jit.jit_fuser is eager
        # torch.compile itself is the device adaptor's (the target's compiler); jit_fuser is not even that
        assert getattr(torch.compile, "__wrapped__", None) is original_compile
        assert gelu.bias_gelu is compiled._torchdynamo_orig_callable
        x, b = torch.randn(5), torch.randn(5)
        y = x + b
        expected = y * 0.5 * (1.0 + torch.tanh(0.79788456 * y * (1 + 0.044715 * y * y)))
        torch.testing.assert_close(gelu.bias_gelu(b, x), expected)
    finally:
        ascend_patch.remove()
    assert jit.jit_fuser is original_compile and gelu.bias_gelu is compiled


def test_modules_imported_after_apply_are_never_compiled():
    code = ("import ascend_patch, torch\n"
            "from ascend_patch.config import Settings\n"
            "ascend_patch.apply(Settings(device='cpu'))\n"
            "import megatron.core.fusions.fused_bias_swiglu as m\n"
            "assert not hasattr(m.swiglu, '_torchdynamo_orig_callable'), m.swiglu\n"
            "x = torch.randn(4, 6)\n"
            "a, b = x.chunk(2, -1)\n"
            "torch.testing.assert_close(m.swiglu(x), torch.nn.functional.silu(a) * b)\n"
            "print('eager')\n")
    from mcore_run import child_env

    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("eager")


def test_the_compiled_function_list_holds_every_function_the_installed_megatron_compiles():
    """COMPILED_AT_IMPORT names every function megatron-core compiles at import (scanned unpatched); the
    entries of other releases are absent here (tests/megatron_lm/test_releases.py scans every release)."""
    code = ("import importlib, json\n"
            "from ascend_patch.adaptors.megatron.jit import COMPILED_AT_IMPORT, compiled_functions\n"
            "for module in sorted({m for m, _ in COMPILED_AT_IMPORT}):\n"
            "    try:\n"
            "        importlib.import_module(module)\n"
            "    except ImportError:\n"
            "        pass  # a module of another release\n"
            "import megatron.core.models.gpt, megatron.core.transformer.moe.moe_layer\n"
            "print(json.dumps(sorted({f'{m}:{a}' for m, a, _ in compiled_functions()})))\n")
    from mcore_run import child_env

    out = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    from ascend_patch.adaptors.megatron.jit import COMPILED_AT_IMPORT

    scanned = set(json.loads(out.stdout.strip().splitlines()[-1]))
    listed = {f"{m}:{a}" for m, a in COMPILED_AT_IMPORT}
    assert len(scanned) == 39 and scanned <= listed, scanned - listed


def _norm_config(**kw):
    base = dict(layernorm_zero_centered_gamma=False, persist_layer_norm=False, sequence_parallel=False,
                memory_efficient_layer_norm=False, normalization="RMSNorm")
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("normalization", ["RMSNorm", "LayerNorm"])
def test_torch_norm_under_sequence_parallel_and_persist(patched, normalization):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    norm = WrappedTorchNorm(_norm_config(sequence_parallel=True, persist_layer_norm=True,
                                         normalization=normalization), 8, eps=1e-5)
    params = list(norm.parameters())
    assert params and all(getattr(p, "sequence_parallel", False) for p in params)
    x = torch.randn(3, 8)
    if normalization == "RMSNorm":
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    else:
        expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)
    plain = WrappedTorchNorm(_norm_config(normalization=normalization), 8)
    assert not any(getattr(p, "sequence_parallel", False) for p in plain.parameters())


def test_fused_layer_norm_builds_the_torch_norm_for_rms_configs(patched):
    """With the apex shim, megatron's local spec picks FusedLayerNorm, which refuses RMSNorm."""
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm

    rms = FusedLayerNorm(_norm_config(sequence_parallel=True), 8, eps=1e-6)
    assert isinstance(rms, torch.nn.RMSNorm) and rms.eps == 1e-6
    assert all(getattr(p, "sequence_parallel", False) for p in rms.parameters())
    # LayerNorm stays megatron's own module running on the apex shim; that needs megatron imported
    # after the patch (as `import ascend_patch` first arranges), so check it in a fresh process
    code = (
        "import types, torch, ascend_patch\n"
        "from megatron.core.fusions.fused_layer_norm import FusedLayerNorm\n"
        "cfg = types.SimpleNamespace(layernorm_zero_centered_gamma=False, persist_layer_norm=False,\n"
        "    sequence_parallel=False, memory_efficient_layer_norm=False, normalization='LayerNorm',\n"
        "    apply_layernorm_1p=False)\n"
        "layer = FusedLayerNorm(cfg, 8, eps=1e-5)\n"
        "x = torch.randn(3, 8)\n"
        "ref = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)\n"
        "print(type(layer).__name__, (layer(x) - ref).abs().max().item() < 1e-5)\n")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH_DEVICE="cpu"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["FusedLayerNorm", "True"]


def test_torch_norm_refuses_zero_centered_gamma_clearly(patched):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    with pytest.raises(ValueError, match="layernorm_zero_centered_gamma"):
        WrappedTorchNorm(_norm_config(layernorm_zero_centered_gamma=True), 8)


def test_wgrad_shim_accumulates_in_place(patched):
    import importlib.util

    spec = importlib.util.find_spec("fused_weight_gradient_mlp_cuda")
    assert spec is not None and "ascend_patch shim" in spec.origin
    ext = importlib.import_module("fused_weight_gradient_mlp_cuda")
    x, g = torch.randn(6, 4), torch.randn(6, 3)
    main_grad = torch.randn(3, 4)
    start = main_grad.clone()
    ext.wgrad_gemm_accum_fp32(x, g, main_grad)
    torch.testing.assert_close(main_grad, start + g.t() @ x)
    # 16-bit activations into an fp32 main_grad: the product is accumulated in fp32
    xb, gb = x.bfloat16(), g.bfloat16()
    acc = torch.zeros(3, 4)
    ext.wgrad_gemm_accum_fp32(xb, gb, acc)
    torch.testing.assert_close(acc, gb.float().t() @ xb.float())
    half = torch.zeros(3, 4, dtype=torch.bfloat16)
    ext.wgrad_gemm_accum_fp16(xb, gb, half)
    torch.testing.assert_close(half.float(), (gb.float().t() @ xb.float()), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="2-D"):
        ext.wgrad_gemm_accum_fp32(x.unsqueeze(0), g, main_grad)


def test_gradient_accumulation_fusion_in_column_parallel_linear(mcore_world):
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    config = ModelParallelConfig(gradient_accumulation_fusion=True, use_cpu_initialization=True)
    layer = ColumnParallelLinear(4, 3, config=config, init_method=torch.nn.init.normal_, bias=False,
                                 gather_output=False)
    layer.weight.main_grad = torch.zeros_like(layer.weight)
    x = torch.randn(5, 2, 4, requires_grad=True)
    out, _ = layer(x)
    g = torch.randn_like(out)
    out.backward(g)
    expected = g.reshape(-1, 3).t() @ x.detach().reshape(-1, 4)
    torch.testing.assert_close(layer.weight.main_grad, expected)
    torch.testing.assert_close(x.grad, g @ layer.weight.detach())


def test_host_rng_fork_restores_the_generator_and_keeps_streams(mcore_world, caplog):
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker, get_cuda_rng_tracker

    from ascend_patch.adaptors.megatron.rng import HOST_RNG_MESSAGE

    caplog.set_level(logging.WARNING, logger="megatron.core.tensor_parallel.random")
    tracker = get_cuda_rng_tracker()
    before = torch.get_rng_state()
    with tracker.fork():
        first = torch.nn.functional.dropout(torch.ones(64), 0.5)
    assert torch.equal(torch.get_rng_state(), before)  # nothing escapes the fork on the host
    with tracker.fork():
        second = torch.nn.functional.dropout(torch.ones(64), 0.5)
    assert not torch.equal(first, second)  # the tracked stream advanced
    model_parallel_cuda_manual_seed(1234)
    with get_cuda_rng_tracker().fork():
        again = torch.nn.functional.dropout(torch.ones(64), 0.5)
    assert torch.equal(first, again)  # same seed, same per-rank stream
    assert HOST_RNG_MESSAGE not in caplog.text
    # the stock fork (the patch's wrapped original) does log it on this target: the patch drops only that
    stock = CudaRNGStatesTracker.fork.__wrapped__
    with stock(get_cuda_rng_tracker()):
        torch.nn.functional.dropout(torch.ones(8), 0.5)
    assert HOST_RNG_MESSAGE in caplog.text
