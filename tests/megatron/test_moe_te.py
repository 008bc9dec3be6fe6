"""MoE experts of megatron-core's Transformer Engine spec on ascend_patch's transformer_engine layer.

``--moe-grouped-gemm`` under the default ``--transformer-impl transformer_engine`` builds
``TEGroupedMLP``, whose linears are ``transformer_engine.pytorch.GroupedLinear``
(:mod:`ascend_patch.adaptors.megatron.te.grouped`); without it, ``SequentialMLP`` of TE linears. Given the local
SequentialMLP's weights, both compute its numbers, and the grouped experts' checkpoint keys are the
sequential experts' (megatron's torch_dist checkpoints load into either).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, child_env, free_port

CHILD = os.path.join(os.path.dirname(__file__), "moe_te_child.py")


@pytest.fixture(scope="module")
def result():
    refs = os.path.join(REPO, "tests", "ops", "npu_references.py")
    proc = subprocess.run([sys.executable, CHILD, refs], capture_output=True, text=True, timeout=600, cwd="/tmp",
                          env=child_env(MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[0][len("RESULT "):])


def test_te_spec_builds_grouped_experts_on_the_layer(result):
    assert result["experts"] == {"grouped": "TEGroupedMLP", "sequential": "SequentialMLP"}
    assert result["fc1"] == "TEColumnParallelGroupedLinear"
    assert result["fc1_base"] == "megatron.core.extensions.transformer_engine"  # megatron's TEGroupedLinear


@pytest.mark.parametrize("name", ["grouped", "sequential", "fused"])
def test_te_experts_compute_the_local_experts_numbers(result, name):
    # output, input gradient and aux loss; then the experts' fc1 weight gradients
    assert result[f"{name}_diff"] < 1e-6 and result[f"{name}_wgrad_diff"] < 1e-6, result
    assert 0.9 < result["aux"] < 1.5  # the router's aux loss, about 1 for a fresh router


def test_grouped_and_sequential_experts_share_checkpoint_keys(result):
    assert result["sharded_keys_equal"], result["sharded_keys"]
    assert "mlp.experts.experts.linear_fc1.weight" in result["sharded_keys"]  # megatron's own key


def test_grouped_experts_on_the_npu_kernel(result):
    assert result["npu_diff"] < 1e-6
    assert result["npu_group_types"] == [0, 0, 0, 2, 0, 2]  # fc1, fc2; then fc2's and fc1's dgrad and wgrad


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_permute_fusion_on_the_npu_permutation_kernels_is_the_unfused_dispatch(result, dispatcher):
    """megatron's dispatchers with --moe-permute-fusion, npu_moe_token_permute / unpermute injected: output,
    input gradient, aux loss and expert weight gradients equal to the unfused run, bit for bit (top-2)."""
    assert result[f"permute_{dispatcher}_diff"] == 0.0 and result[f"permute_{dispatcher}_wgrad_diff"] == 0.0, result


def test_permute_fusion_calls_the_kernels_with_megatrons_shapes(result):
    # 32 tokens (16 x 2), top-2 of 4 experts: one permute and one unpermute per dispatcher, forward only
    # (the references are differentiated by autograd, not called again in backward)
    assert result["permute_calls"] == [[[32, 2], "torch.int32", 64]] * 2, result["permute_calls"]
    # the dispatchers merge no probabilities in unpermute: the kernel sums each token's rows with weights 1
    assert result["unpermute_calls"] == [[[64], [32, 2]]] * 2, result["unpermute_calls"]
