"""megatron-core's MoE layer on the cpu target, in one process: dispatchers, expert implementations, patches."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import REPO
from mcore_run import mcore_world  # noqa: F401  (fixture)

EXPERTS, HIDDEN, FFN = 4, 32, 48


def _npu_references():
    """tests/ops/npu_references.py (the documented torch_npu kernels), loaded by path: a second
    ``tests/ops`` entry on sys.path would shadow this folder's modules."""
    spec = importlib.util.spec_from_file_location("moe_npu_references", f"{REPO}/tests/ops/npu_references.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def moe_layer(grouped: bool, dispatcher: str, glu: bool = True, bf16: bool = False):
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=FFN, num_moe_experts=EXPERTS,
        moe_router_topk=2, moe_token_dispatcher_type=dispatcher, moe_grouped_gemm=grouped,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01, add_bias_linear=False,
        gated_linear_unit=glu, activation_func=F.silu if glu else F.gelu, use_cpu_initialization=True,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32)
    layer = build_module(get_moe_module_spec(use_te=False, num_experts=EXPERTS, moe_grouped_gemm=grouped),
                         config=config)
    layer.set_layer_number(1)  # the router records its aux loss for logging under the layer number
    return layer.bfloat16() if bf16 else layer


def copy_into_grouped(sequential, grouped) -> None:
    """Give a GroupedMLP layer the router and expert weights of a SequentialMLP layer."""
    grouped.router.weight.data.copy_(sequential.router.weight.data)
    w1 = grouped.experts.weight1.data.view(EXPERTS, HIDDEN, -1)  # GroupedMLP's own view of its weights
    w2 = grouped.experts.weight2.data.view(EXPERTS, -1, HIDDEN)
    for e, expert in enumerate(sequential.experts.local_experts):
        w1[e].copy_(expert.linear_fc1.weight.data.t())
        w2[e].copy_(expert.linear_fc2.weight.data.t())


def run(layer, x):
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

    clear_aux_losses_tracker()
    x = x.detach().clone().requires_grad_()
    out, bias = layer(x)
    assert bias is None
    out.backward(torch.ones_like(out) / out.numel())
    aux = get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"]
    return out.detach(), x.grad, aux.clone()


@pytest.mark.parametrize("glu", [True, False])
def test_grouped_gemm_experts_equal_the_sequential_experts(mcore_world, glu):
    torch.manual_seed(0)
    sequential = moe_layer(False, "alltoall", glu)
    grouped = moe_layer(True, "alltoall", glu)
    assert type(sequential.experts).__name__ == "SequentialMLP" and type(grouped.experts).__name__ == "GroupedMLP"
    copy_into_grouped(sequential, grouped)
    x = torch.randn(16, 2, HIDDEN)
    out_s, dx_s, aux_s = run(sequential, x)
    out_g, dx_g, aux_g = run(grouped, x)
    torch.testing.assert_close(out_g, out_s, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dx_g, dx_s, atol=1e-7, rtol=1e-5)
    assert aux_s[0] > 0 and torch.equal(aux_g, aux_s)  # the aux loss is the router's: same weights, same loss
    # the expert weight gradients, mapped through GroupedMLP's layout
    g1 = grouped.experts.weight1.grad.view(EXPERTS, HIDDEN, -1)
    for e, expert in enumerate(sequential.experts.local_experts):
        torch.testing.assert_close(g1[e], expert.linear_fc1.weight.grad.t(), atol=1e-7, rtol=1e-5)


def test_both_dispatchers_agree(mcore_world):
    torch.manual_seed(0)
    alltoall = moe_layer(True, "alltoall")
    allgather = moe_layer(True, "allgather")
    allgather.load_state_dict(alltoall.state_dict())
    x = torch.randn(16, 2, HIDDEN)
    for got, want in zip(run(allgather, x), run(alltoall, x)):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-6)


def test_grouped_mlp_keeps_bf16_and_its_config(mcore_world):
    torch.manual_seed(0)
    layer = moe_layer(True, "alltoall", bf16=True)
    config = layer.experts.config
    out, dx, _ = run(layer, torch.randn(16, 2, HIDDEN).bfloat16())
    assert out.dtype == torch.bfloat16 and dx.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert layer.experts.config is config  # the dtype answer lasts one forward only


def test_stock_grouped_mlp_refuses_fp32_and_the_patch_lifts_only_that(mcore_world):
    from ascend_patch.adaptors.megatron.moe import _DtypesOfTheTarget

    torch.manual_seed(0)
    layer = moe_layer(True, "alltoall")
    forward = type(layer.experts).forward
    stock = forward.__wrapped__
    tokens, probs = torch.randn(6, HIDDEN), torch.rand(6)
    with pytest.raises(AssertionError, match="only supports bf16"):
        stock(layer.experts, tokens, torch.tensor([2, 0, 3, 1]), probs)
    out, _ = layer.experts(tokens, torch.tensor([2, 0, 3, 1]), probs)
    assert out.shape == (6, HIDDEN) and layer.experts.config.bf16 is False
    assert not isinstance(layer.experts.config, _DtypesOfTheTarget)


def test_te_general_gemm_is_added_where_missing_and_removed(cpu_settings):
    import ascend_patch
    import megatron.core.transformer.moe.moe_utils as moe_utils

    had = "te_general_gemm" in vars(moe_utils)  # megatron-core defines it only when TE imports
    ascend_patch.apply(cpu_settings)
    try:
        assert moe_utils.te_general_gemm is None
    finally:
        ascend_patch.remove()
    assert ("te_general_gemm" in vars(moe_utils)) == had


def test_grouped_gemm_shim_reaches_megatron_imported_before_apply(cpu_settings):
    import ascend_patch
    import megatron.core.transformer.moe.grouped_gemm_util as gg
    from ascend_patch.shim import is_shim

    before = (gg.grouped_gemm, gg.ops)
    assert importlib.util.find_spec("grouped_gemm") is None or is_shim(sys.modules.get("grouped_gemm"))
    ascend_patch.apply(cpu_settings)
    try:
        assert gg.grouped_gemm_is_available()
        assert is_shim(gg.grouped_gemm) and gg.ops is gg.grouped_gemm.ops
        import grouped_gemm

        assert grouped_gemm is gg.grouped_gemm  # the module the finder serves is the one megatron holds
        x, w = torch.randn(5, 4), torch.randn(2, 4, 3)
        torch.testing.assert_close(gg.ops.gmm(x, w, torch.tensor([2, 3])), torch.cat([x[:2] @ w[0], x[2:] @ w[1]]))
        with pytest.raises(AttributeError, match="grouped_gemm.ops.permute is not provided"):
            gg.ops.permute
    finally:
        ascend_patch.remove()
    assert (gg.grouped_gemm, gg.ops) == before and "grouped_gemm" not in sys.modules


def test_grouped_mlp_on_the_npu_kernel(cpu_settings, tmp_path):
    """GroupedMLP through the shim's gmm with npu_grouped_matmul injected: the values of the cpu path,
    one kernel call per GEMM (fc1, fc2 forward; input and weight gradient of each backward)."""
    import ascend_patch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from ascend_patch.backend import cpu_backend

    refs = _npu_references()
    CallLog, reference_npu_grouped_matmul = refs.CallLog, refs.reference_npu_grouped_matmul

    backend = cpu_backend("tests: npu_grouped_matmul injected")
    ascend_patch.apply(cpu_settings, backend=backend)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(1234)
        torch.manual_seed(0)
        sequential, grouped = moe_layer(False, "alltoall"), moe_layer(True, "alltoall")
        copy_into_grouped(sequential, grouped)
        x = torch.randn(16, 2, HIDDEN)
        want = run(sequential, x)
        log = CallLog(reference_npu_grouped_matmul)
        with backend.kernels.override(npu_grouped_matmul=log):
            got = run(grouped, x)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        assert [c["group_type"] for c in log.calls] == [0, 0, 0, 2, 0, 2]  # fc1, fc2, then fc2's and fc1's grads
        sizes = log.calls[0]["group_list"].tolist()
        assert sum(sizes) == 16 * 2 * 2 and len(sizes) == EXPERTS  # every token routed to its top 2
        assert all(c["group_list"].tolist() == sizes for c in log.calls)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        ascend_patch.remove()


def test_grouped_mlp_built_after_apply_is_eager_with_megatron_imported_first(cpu_settings):
    import ascend_patch
    import megatron.core.transformer.moe.experts as experts
    from ascend_patch.adaptors.megatron.jit import eager

    before = experts.jit_fuser
    ascend_patch.apply(cpu_settings)
    try:
        assert experts.jit_fuser is eager  # GroupedMLP.__init__ decorates its activations with it
    finally:
        ascend_patch.remove()
    assert experts.jit_fuser is before
