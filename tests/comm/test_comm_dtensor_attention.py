"""SDPA on sharded DTensors off CUDA (comm.dtensor_attention): the cpu kernel, the PrivateUse1 kernel, the math path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers import child_env, free_port

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def mesh(patched):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cuda", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("placement", ["heads", "batch", "replicated"])
@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {}, {"is_causal": True, "scale": 0.3}])
def test_cpu_flash_attention_on_sharded_dtensors_equals_the_unsharded_result(mesh, placement, kwargs):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    place = {"heads": Shard(1), "batch": Shard(0), "replicated": Replicate()}[placement]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    dq, dk, dv = (distribute_tensor(t.detach(), mesh, [place]).requires_grad_() for t in (q, k, v))
    assert torch._fused_sdp_choice(q, k, v, **kwargs) == torch.nn.attention.SDPBackend.FLASH_ATTENTION.value
    out = F.scaled_dot_product_attention(dq, dk, dv, **kwargs)  # aten._scaled_dot_product_flash_attention_for_cpu
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.placements == (place,)
    torch.testing.assert_close(out.full_tensor(), expected, rtol=0, atol=1e-6)
    out.full_tensor().square().sum().backward()  # ..._for_cpu_backward
    expected.square().sum().backward()
    for sharded, whole in ((dq, q), (dk, k), (dv, v)):
        assert sharded.grad.placements == (place,)
        torch.testing.assert_close(sharded.grad.full_tensor(), whole.grad, rtol=0, atol=1e-5)


def test_masks_and_the_math_path(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v))
    mask = torch.rand(2, 4, 8, 8) > 0.3
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for given in (distribute_tensor(mask, mesh, [Replicate()]), mask):  # a DTensor mask, a plain one
        torch.testing.assert_close(F.scaled_dot_product_attention(dq, dk, dv, attn_mask=given).full_tensor(),
                                   expected, rtol=0, atol=1e-6)
    assert F.scaled_dot_product_attention(dq, dk, dv).placements == (Shard(1),)  # no mask after a mask
    # dropout_p > 0 is SDPA's math decomposition on the host, whose causal mask is a plain tensor
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.5) == torch.nn.attention.SDPBackend.MATH.value
    torch.manual_seed(2)
    dropped = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True, dropout_p=0.5)
    assert dropped.placements == (Shard(1),) and dropped.shape == (2, 4, 8, 16)
    undropped = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.isfinite(dropped.full_tensor()).all()
    assert (dropped.full_tensor() - undropped).abs().max().item() > 0.1  # dropout happened


def test_the_strategy_table_overlay_writes_through_and_remove_puts_torch_s_table_back(cpu_settings):
    import ascend_patch
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    original = propagator.op_strategy_funcs
    cpu_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert cpu_op not in original
    with ascend_patch.patched(cpu_settings):
        table = propagator.op_strategy_funcs
        assert table is not original and cpu_op in table
        assert torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default in table
        assert table[torch.ops.aten.mm.default] is original[torch.ops.aten.mm.default]
        marker = torch.ops.aten.digamma.default
        had = marker in original

        def strategy(schema):
            return None

        table[marker] = strategy  # a registration while patched lands in torch's own table
        assert original[marker] is strategy
        if not had:
            del table[marker]
        assert (marker in original) is had
    assert propagator.op_strategy_funcs is original and cpu_op not in original


def test_the_npu_target_s_kernels_on_sharded_dtensors_through_the_test_double():
    done = subprocess.run([sys.executable, os.path.join(HERE, "dtensor_npu_child.py")], capture_output=True,
                          text=True, env=child_env(ASCEND_PATCH="0"), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["target"], out["mesh"], out["local_device"]) == ("npu", "npu", "npu:0")
    placement, error = out["math"]  # the double has no fused kernel: SDPA decomposes
    assert placement == "S(1)" and error < 1e-6
    out_place, out_err, lse_place, grad_place, grad_err = out["overrideable"]  # a PrivateUse1 backend's own kernel
    assert (out_place, lse_place, grad_place) == ("S(1)", "S(1)", "S(1)")
    assert out_err < 1e-6 and grad_err < 1e-5


@pytest.mark.slow
def test_the_fsdp_tp_example_s_block_tensor_parallel_equals_the_unsharded_block(tmp_path):
    port, out = str(free_port()), tmp_path / "result"
    procs = [subprocess.Popen([sys.executable, "-m", "ascend_patch", os.path.join(HERE, "dtensor_attention_child.py"),
                               str(out)],
                              env=child_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, ASCEND_PATCH_DEVICE="cpu"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"result.{rank}").read_text())
        assert (result["world"], result["grads"], result["dropout_shape"]) == (2, 9, [4, 32, 256])
        assert result["out_scale"] > 1.0 and result["out_err"] < 1e-5  # fp32 sums in another order
        assert result["grad_err"] < 1e-6
