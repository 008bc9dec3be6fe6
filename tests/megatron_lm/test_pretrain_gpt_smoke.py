"""Megatron-LM's pretrain_gpt.py, unchanged, trains under ``torchrun -m ascend_patch`` (local impl, TP2).

Run as a user would: no ``CUDA_DEVICE_MAX_CONNECTIONS``, no triton, a pip-installed megatron-core
(no Makefile for the dataset helpers), no nvcc.
"""

from __future__ import annotations

import pytest

from mlm_harness import TINY_GPT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tp2_run(megatron_lm, tmp_path_factory):
    return megatron_lm.run([*TINY_GPT, "--transformer-impl", "local", "--train-iters", "3",
                            "--tensor-model-parallel-size", "2"], tmp_path_factory.mktemp("tp2"), nproc=2)


def test_tp2_trains_and_the_loss_falls(tp2_run):
    assert tp2_run.iterations == [1, 2, 3]
    losses = tp2_run.losses
    assert 4.5 < losses[0] < 5.5 + 0.5  # ln(128) = 4.85 for a fresh model, plus init noise
    assert losses[2] < losses[1] < losses[0]
    assert all(0 < norm < 10 for norm in tp2_run.grad_norms)


def test_the_full_precision_log_is_what_megatron_prints(tp2_run):
    # Megatron prints 7 significant digits; at iteration 2 it prints the mean of iterations 1 and 2
    # (its first log line does not reset the accumulator), from iteration 3 on each iteration's own
    loss, norm = tp2_run.losses, tp2_run.grad_norms
    printed = tp2_run.printed
    assert printed[1][0] == pytest.approx(loss[0], rel=1e-6)
    assert printed[2][0] == pytest.approx((loss[0] + loss[1]) / 2, rel=1e-6)
    assert printed[3][0] == pytest.approx(loss[2], rel=1e-6)
    for i in (1, 2, 3):
        assert printed[i][1] == pytest.approx(norm[i - 1], abs=5e-4)
    assert any(len(repr(value)) > 12 for value in loss)  # more digits than the printed 5.545462


def test_the_launch_needed_none_of_the_cuda_tools(tp2_run):
    out = tp2_run.output
    assert "compiling dataset index builder" in out and ">>> done with dataset index builder" in out
    assert ">>> done with compiling and loading fused kernels" in out
    assert "No targets specified and no makefile found" not in out
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in out
