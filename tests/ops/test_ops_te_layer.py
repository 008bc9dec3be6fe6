"""The transformer_engine shim's layers (ascend_patch.adaptors.megatron.te) against torch references, on the cpu path and,
with reference kernels injected into the kernel table, on the npu path; the shim's lifecycle and refusals."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from ascend_patch.shim import ShimImportError, ShimMissing, is_shim
from ascend_patch.unsupported import UnsupportedOption
from npu_references import CallLog, reference_npu_fusion_attention, reference_npu_rms_norm


@pytest.fixture
def te(patched):
    if importlib.util.find_spec("transformer_engine") is not None and not importlib.util.find_spec(
            "transformer_engine").origin.startswith("ascend_patch shim"):
        pytest.skip("transformer_engine is really installed here")
    import transformer_engine.pytorch as tep

    return tep


@pytest.fixture
def world(te, tmp_path):
    """A one-process gloo world with megatron-core's parallel state and RNG tracker (seed 1234)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    try:
        yield te
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _import_as(module_name: str, statement: str) -> dict:
    scope = {"__name__": module_name}
    exec(compile(statement, f"<{module_name}>", "exec"), scope)
    return scope


def test_megatron_sees_the_layer_and_remove_takes_it_away(cpu_settings, monkeypatch):
    import ascend_patch
    from ascend_patch.adaptors.megatron.te import SURFACE, TE_VERSION

    monkeypatch.delitem(sys.modules, "megatron.core.extensions.transformer_engine", raising=False)
    ascend_patch.apply(cpu_settings)
    try:
        scope = _import_as("megatron.core.probe", "import transformer_engine as te\n"
                                                  "from transformer_engine.pytorch.fp8 import fp8_autocast")
        te = scope["te"]
        assert is_shim(te) and te.__version__ == TE_VERSION == "2.7.0"
        assert importlib.util.find_spec("transformer_engine").origin == "ascend_patch shim (transformer_engine is " \
                                                                        "not installed)"
        for name in SURFACE:
            assert is_shim(importlib.import_module(name)), name
        # one class per name: the module megatron reads and the submodule path agree
        import transformer_engine.pytorch as tep
        assert tep.Linear.__module__ == "transformer_engine.pytorch.module.linear"
        assert tep.Linear is importlib.import_module("transformer_engine.pytorch").Linear
        with pytest.raises(ShimImportError, match=r"--tp-comm-overlap"):
            _import_as("megatron.training.probe", "from transformer_engine.pytorch import module")
        # TE's op-based API: the names megatron-core reads exist; building one refuses, naming what built it
        with pytest.raises(UnsupportedOption, match=r"ops\.SwiGLU was built by megatron-core's TE activation, "
                                                    r"selected by --use-te-activation-func \(megatron\.core\.probe"):
            _import_as("megatron.core.probe", "import transformer_engine as te\nclass TEActivationOp:\n"
                                              "    def __init__(self):\n        te.pytorch.ops.SwiGLU()\n"
                                              "TEActivationOp()")
        with pytest.raises(UnsupportedOption, match=r"ops\.GELU was built by megatron-core's TEFusedMLP, the MLP of "
                                                    r"--use-transformer-engine-op-fuser"):
            _import_as("megatron.core.probe", "import transformer_engine as te\nclass TEFusedMLP:\n"
                                              "    def __init__(self):\n        te.pytorch.ops.GELU()\n"
                                              "TEFusedMLP()")
        with pytest.raises(ShimMissing, match=r"--use-te-activation-func"):
            tep.ops.NoSuchOperation
        router = importlib.import_module("transformer_engine.pytorch.router")  # megatron imports it from 2.7
        assert is_shim(router) and callable(router.fused_topk_with_score_function)
    finally:
        ascend_patch.remove()
    assert not [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]
    assert importlib.util.find_spec("transformer_engine") is None


def test_megatron_imported_first_without_te_keeps_its_local_path(cpu_settings, monkeypatch):
    """megatron-core decided "no TE" at import: shown the layer now, it would mix both answers."""
    import types

    import ascend_patch

    decided = types.ModuleType("megatron.core.extensions.transformer_engine")
    decided.HAVE_TE = False
    monkeypatch.setitem(sys.modules, "megatron.core.extensions.transformer_engine", decided)
    report = ascend_patch.apply(cpu_settings)
    try:
        with pytest.raises(ModuleNotFoundError, match="transformer_engine"):
            _import_as("megatron.core.transformer.probe", "import transformer_engine.pytorch")
        import transformer_engine.pytorch as tep  # user code still gets the layer

        assert is_shim(tep) and tep.Linear.__name__ == "Linear"
        (status,) = [s for s in report.statuses if s.patch.target == "transformer_engine"]
        assert status.patch.hidden_from == ("megatron",) and status.detail.endswith("; not to megatron")
    finally:
        ascend_patch.remove()


def test_linear_is_the_gemm_with_tes_bias_and_parameter_conventions(world):
    te = world
    torch.manual_seed(0)
    x = torch.randn(5, 3, 16, requires_grad=True)
    lin = te.Linear(16, 8, bias=True, params_dtype=torch.float32)
    with torch.no_grad():
        lin.bias.normal_()
    out = lin(x)
    ref = F.linear(x, lin.weight, lin.bias)
    torch.testing.assert_close(out, ref)
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(gx, torch.autograd.grad(ref.square().sum(), x)[0])
    # return_bias: the bias comes back unadded; bias=False leaves an empty tensor, as TE does
    split = te.Linear(16, 8, bias=True, return_bias=True)
    got, bias = split(x)
    assert bias is split.bias and torch.equal(got, F.linear(x, split.weight))
    nobias = te.Linear(16, 8, bias=False)
    assert nobias.bias.numel() == 0 and "bias" not in dict(nobias.named_parameters())
    # TE's tags: weights tensor-parallel (dim 1 for row), column bias dim 0, row bias sequence_parallel
    col = te.Linear(16, 8, parallel_mode="column")
    row = te.Linear(16, 8, parallel_mode="row", sequence_parallel=True)
    assert (col.weight.tensor_model_parallel, col.weight.partition_dim, col.bias.partition_dim) == (True, 0, 0)
    assert (row.weight.partition_dim, row.bias.sequence_parallel) == (1, False)  # SP needs TP > 1
    # the state dict carries TE's (empty) extra state, and takes an empty one back
    state = lin.state_dict()
    assert state["_extra_state"].dtype == torch.uint8 and state["_extra_state"].numel() == 0
    lin.load_state_dict(state)


def test_weights_draw_megatrons_model_parallel_stream_like_its_local_layers(world):
    """TE's init: init_method inside get_rng_state_tracker().fork() - the stream megatron's local layers use."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker
    from megatron.core.tensor_parallel.layers import _initialize_affine_weight_gpu

    te = world
    init = lambda w: torch.nn.init.normal_(w, 0.0, 0.02)  # noqa: E731
    state = get_cuda_rng_tracker().get_states()
    lin = te.Linear(16, 8, parallel_mode="column", init_method=init, get_rng_state_tracker=get_cuda_rng_tracker)
    get_cuda_rng_tracker().set_states(state)
    expected = torch.empty(8, 16)
    _initialize_affine_weight_gpu(expected, init, partition_dim=0)
    assert torch.equal(lin.weight.detach(), expected)
    assert not torch.equal(expected, torch.zeros_like(expected))


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_layer_norm_linear_is_the_norm_then_the_gemm(world, normalization, zero_centered):
    te = world
    torch.manual_seed(1)
    x = torch.randn(6, 2, 16, requires_grad=True)
    mod = te.LayerNormLinear(16, 12, eps=1e-5, normalization=normalization, zero_centered_gamma=zero_centered,
                             return_layernorm_output=True, bias=False)
    names = [n for n, _ in mod.named_parameters()]
    assert names == (["layer_norm_weight", "layer_norm_bias", "weight"] if normalization == "LayerNorm"
                     else ["layer_norm_weight", "weight"])
    assert torch.equal(mod.layer_norm_weight, torch.full((16,), 0.0 if zero_centered else 1.0))
    with torch.no_grad():
        mod.layer_norm_weight.normal_()
    gamma = mod.layer_norm_weight + 1 if zero_centered else mod.layer_norm_weight
    if normalization == "RMSNorm":
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    else:
        normed = F.layer_norm(x, (16,), gamma, mod.layer_norm_bias, 1e-5)
    out, ln_out = mod(x)
    torch.testing.assert_close(ln_out, normed)
    torch.testing.assert_close(out, F.linear(normed, mod.weight))
    grads = torch.autograd.grad(out.sum(), (x, mod.layer_norm_weight))
    refs = torch.autograd.grad(F.linear(normed, mod.weight).sum(), (x, mod.layer_norm_weight))
    for got, ref in zip(grads, refs):
        torch.testing.assert_close(got, ref)


def test_norms_tag_sequence_parallel_and_run_npu_rms_norm_when_the_target_has_it(te):
    from ascend_patch import active_backend

    torch.manual_seed(2)
    x = torch.randn(4, 2, 32)
    rms = te.RMSNorm(hidden_size=32, eps=1e-6, sequence_parallel=True)
    ln = te.LayerNorm(32, eps=1e-5, sequence_parallel=True)
    assert rms.weight.sequence_parallel and ln.weight.sequence_parallel and ln.bias.sequence_parallel
    with torch.no_grad():
        rms.weight.normal_()
    plain = rms(x)
    torch.testing.assert_close(plain, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * rms.weight)
    torch.testing.assert_close(ln(x), F.layer_norm(x, (32,), ln.weight, ln.bias, 1e-5))
    kernel = CallLog(reference_npu_rms_norm)
    with active_backend().kernels.override(npu_rms_norm=kernel):
        through = rms(x)
    assert len(kernel.calls) == 1 and kernel.calls[0]["epsilon"] == 1e-6
    torch.testing.assert_close(through, plain, rtol=1e-5, atol=1e-6)


def test_classes_kept_after_remove_follow_the_target_of_the_moment(cpu_settings):
    """megatron keeps the shim's classes across remove() and a new apply(): they run on the target applied now,
    and on the pure-torch reference while nothing is applied (there is no target bound to a class)."""
    import ascend_patch
    from ascend_patch.backend import cpu_backend, current_target

    ascend_patch.apply(cpu_settings)
    try:
        from transformer_engine.pytorch import RMSNorm  # what megatron's TENorm holds
        from transformer_engine.pytorch.distributed import CudaRNGStatesTracker
    finally:
        ascend_patch.remove()
    torch.manual_seed(3)
    x = torch.randn(3, 16)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert current_target().kernels.names() == []  # nothing applied: the reference
    torch.testing.assert_close(norm(x), want)
    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 7)  # the reference's device module: the host generator
    stand_in = cpu_backend("tests: a later apply whose table has npu_rms_norm")
    kernel = CallLog(reference_npu_rms_norm)
    ascend_patch.apply(cpu_settings, backend=stand_in)
    try:
        with stand_in.kernels.override(npu_rms_norm=kernel):
            through = norm(x)  # the class of the earlier apply, on this apply's target
            assert str(RMSNorm(16).weight.device) == "cpu"
    finally:
        ascend_patch.remove()
    assert len(kernel.calls) == 1 and kernel.calls[0]["epsilon"] == 1e-6
    torch.testing.assert_close(through, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm(x), want)
    assert len(kernel.calls) == 1  # removed again: back on the reference


def _explicit(q, k, v, keep, scale):
    """Textbook attention, q (b, sq, h, d), k/v (b, sk, g, d), keep (sq, sk) or None."""
    h, g = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(h // g, 2), v.repeat_interleave(h // g, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_dot_product_attention_causal_gqa_in_both_layouts(te, fmt):
    torch.manual_seed(3)
    b, s, h, g, d = 2, 10, 4, 2, 8
    q, k, v = torch.randn(b, s, h, d), torch.randn(b, s, g, d), torch.randn(b, s, g, d)
    attn = te.DotProductAttention(h, d, num_gqa_groups=g, qkv_format=fmt, attn_mask_type="causal")
    args = (q, k, v) if fmt == "bshd" else tuple(t.transpose(0, 1) for t in (q, k, v))
    out = attn(*args, attention_mask=torch.ones(1, 1, s, s, dtype=torch.bool))  # ignored for causal, as in TE
    expected = _explicit(q, k, v, torch.ones(s, s, dtype=torch.bool).tril(), d ** -0.5).reshape(b, s, h * d)
    torch.testing.assert_close(out, expected if fmt == "bshd" else expected.transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_dot_product_attention_masks_windows_and_packed_sequences(te):
    torch.manual_seed(4)
    b, s, h, d = 1, 8, 2, 4
    q, k, v = torch.randn(b, s, h, d), torch.randn(b, s, h, d), torch.randn(b, s, h, d)
    sb = lambda t: t.transpose(0, 1)  # noqa: E731
    i, j = torch.arange(s).unsqueeze(1), torch.arange(s)
    # arbitrary mask, True = masked out
    masked = (i + j) % 3 == 0
    attn = te.DotProductAttention(h, d, attn_mask_type="arbitrary", softmax_scale=0.5)
    out = attn(sb(q), sb(k), sb(v), attention_mask=masked.view(1, 1, s, s))
    torch.testing.assert_close(out, sb(_explicit(q, k, v, ~masked, 0.5).reshape(b, s, h * d)), rtol=1e-5, atol=1e-6)
    # sliding window (left 2) on a causal mask
    win = te.DotProductAttention(h, d, attn_mask_type="causal", window_size=(2, 0))
    keep = (j <= i) & (j >= i - 2)
    torch.testing.assert_close(win(sb(q), sb(k), sb(v)), sb(_explicit(q, k, v, keep, d ** -0.5).reshape(b, s, h * d)),
                               rtol=1e-5, atol=1e-6)
    # thd: two packed sequences (3 and 5 tokens) attend each on its own
    packed = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out = packed(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_kv=cu)
    parts = [_explicit(q[:, a:e], k[:, a:e], v[:, a:e], torch.ones(e - a, e - a, dtype=torch.bool).tril(), d ** -0.5)
             for a, e in ((0, 3), (3, 8))]
    torch.testing.assert_close(out, torch.cat(parts, 1)[0].reshape(s, h * d), rtol=1e-5, atol=1e-6)


def test_dot_product_attention_runs_npu_fusion_attention_when_the_target_has_it(te):
    from ascend_patch import active_backend

    torch.manual_seed(5)
    s, b, h, g, d = 6, 2, 4, 2, 8
    q = torch.randn(s, b, h, d, requires_grad=True)
    k, v = torch.randn(s, b, g, d), torch.randn(s, b, g, d)
    attn = te.DotProductAttention(h, d, num_gqa_groups=g)
    plain = attn(q, k, v)
    kernel = CallLog(reference_npu_fusion_attention)
    with active_backend().kernels.override(npu_fusion_attention=kernel):
        through = attn(q, k, v)
    (call,) = kernel.calls
    assert call["args"][3:5] == (h, "BSND") and call["sparse_mode"] == 3 and call["scale"] == pytest.approx(d ** -0.5)
    torch.testing.assert_close(through, plain, rtol=1e-5, atol=1e-6)


def test_dropout_draws_from_the_trackers_stream(world):
    """Attention dropout runs inside get_rng_state_tracker().fork(): the same tracker state, the same mask."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    te = world
    attn = te.DotProductAttention(2, 4, attention_dropout=0.5, get_rng_state_tracker=get_cuda_rng_tracker)
    attn.train()
    q = torch.randn(6, 1, 2, 4)
    state = get_cuda_rng_tracker().get_states()
    host = torch.get_rng_state()
    first = attn(q, q, q)
    get_cuda_rng_tracker().set_states(state)
    torch.manual_seed(999)  # the default stream moves; the tracker's does not
    second = attn(q, q, q)
    torch.set_rng_state(host)
    assert torch.equal(first, second)
    attn.eval()
    assert not torch.equal(attn(q, q, q), first)  # no dropout in eval


def test_refusals_name_the_option_and_what_to_do(te):
    from ascend_patch.adaptors.megatron.te.fp8 import FP8Unavailable
    from ascend_patch.errors import AscendPatchError
    from ascend_patch.unsupported import UnsupportedOption

    with pytest.raises(NotImplementedError, match=r"ub_overlap_ag=True\).*--tp-comm-overlap") as info:
        te.Linear(8, 8, ub_overlap_ag=True)
    assert isinstance(info.value, UnsupportedOption) and isinstance(info.value, AscendPatchError)
    with pytest.raises(UnsupportedOption, match=r"--use-transformer-engine-op-fuser"):
        te.ops.Sequential()
    with pytest.raises(NotImplementedError, match=r"delay_wgrad_compute=True.*--delay-wgrad-compute"):
        te.LayerNormLinear(8, 8, delay_wgrad_compute=True)
    with pytest.raises(NotImplementedError, match=r"softmax_type='learnable'.*--softmax-type"):
        te.DotProductAttention(2, 4, softmax_type="learnable")
    attn = te.DotProductAttention(2, 4)
    q = torch.randn(3, 1, 2, 4)
    with pytest.raises(NotImplementedError, match=r"core_attention_bias_type='post_scale_bias'"):
        attn(q, q, q, core_attention_bias_type="post_scale_bias", core_attention_bias=torch.zeros(1, 2, 3, 3))
    with pytest.raises(FP8Unavailable, match=r"--fp8-format"):
        with te.fp8_autocast(enabled=True):
            pass
    with te.fp8_autocast(enabled=False):  # megatron opens it to force full precision
        pass
    from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
    from transformer_engine.pytorch.tensor import QuantizedTensor

    assert FP8GlobalStateManager.is_fp8_enabled() is False and FP8GlobalStateManager.get_fp8_recipe() is None
    assert not isinstance(torch.zeros(1), QuantizedTensor)
    with pytest.raises(FP8Unavailable):
        QuantizedTensor(torch.zeros(1))


def test_rng_tracker_forks_the_targets_generator(te):
    import transformer_engine.pytorch.distributed as ted

    tracker = ted.CudaRNGStatesTracker()
    before = torch.get_rng_state()
    tracker.add("model-parallel-rng", 77)
    assert torch.equal(torch.get_rng_state(), before)  # add leaves the device generator alone
    with tracker.fork():
        a = torch.rand(3)
    with tracker.fork():
        b = torch.rand(3)
    torch.manual_seed(77)
    assert torch.equal(torch.cat([a, b]), torch.rand(6))  # the tracked stream continues across forks
    with pytest.raises(RuntimeError, match="seed 77 already exists"):
        tracker.add("other", 77)
    with pytest.raises(KeyError, match="not added"):
        with tracker.fork("missing"):
            pass
    assert math.isfinite(float(a.sum()))


def test_fp8_support_queries_answer_no_and_say_why(te):
    # megatron-core's tests/unit_tests/models/test_gpt_model.py imports check_fp8_support to be collected at all
    from transformer_engine.common.recipe import DelayedScaling, MXFP8BlockScaling
    from transformer_engine.pytorch.fp8 import (FP8GlobalStateManager, check_fp8_block_scaling_support,
                                                check_fp8_support, check_mxfp8_support, check_nvfp4_support,
                                                check_recipe_support)
    from ascend_patch.adaptors.megatron.te.fp8 import FP8Unavailable

    queries = {"FP8": (check_fp8_support, FP8GlobalStateManager.is_fp8_available),
               "MXFP8": (check_mxfp8_support, FP8GlobalStateManager.is_mxfp8_available),
               "NVFP4": (check_nvfp4_support, FP8GlobalStateManager.is_nvfp4_available),
               "FP8 block scaling": (check_fp8_block_scaling_support,
                                     FP8GlobalStateManager.is_fp8_block_scaling_available)}
    for kind, (query, method) in queries.items():
        supported, why = query()
        assert supported is False
        assert why.startswith(f"{kind} is not supported: the cpu target has no FP8 kernels"), why
        assert method() == (supported, why)
    for recipe in (DelayedScaling(), MXFP8BlockScaling()):
        with pytest.raises(FP8Unavailable, match=rf"check_recipe_support\({type(recipe).__name__}\).*--fp8-format"):
            check_recipe_support(recipe)


def test_linear_passes_process_groups_only_to_releases_that_take_them(world, monkeypatch):
    """megatron-core 0.12's tensor-parallel GEMM has no ``tp_group`` keyword (release fact ``tp_group_arguments``):
    the layer calls it the way that release's own callers do, on the global tensor-parallel group."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers

    from ascend_patch.adaptors.megatron import releases

    te = world
    seen = []
    real = layers.linear_with_grad_accumulation_and_async_allreduce

    def recording(*args, **kwargs):
        seen.append(sorted(kwargs))
        return real(*args, **kwargs)

    recording.warned = getattr(real, "warned", False)  # the function reads its own attribute by its module name
    monkeypatch.setattr(layers, "linear_with_grad_accumulation_and_async_allreduce", recording)
    tp = parallel_state.get_tensor_model_parallel_group()
    lin = te.Linear(16, 8, tp_group=tp)
    x = torch.randn(5, 3, 16)
    for version, keywords in (("0.12.1", []), ("0.13.1", ["tp_group"]), ("0.20.0", ["tp_group"])):
        monkeypatch.setattr(releases, "current_version", lambda version=version: version)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight))
        assert seen.pop() == keywords, version
    monkeypatch.setattr(releases, "current_version", lambda: "0.12.1")
    other = te.Linear(16, 8, tp_group=torch.distributed.new_group([0]))
    with pytest.raises(UnsupportedOption, match=r"megatron-core 0\.12\.1's tensor-parallel GEMM and reductions always "
                                                r"use the global tensor-parallel group"):
        other(x)
