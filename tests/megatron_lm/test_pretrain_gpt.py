"""Megatron-LM's pretrain_gpt.py, unchanged, under ``torchrun -m ascend_patch`` (local impl, cpu target).

Launched as a user would: no ``CUDA_DEVICE_MAX_CONNECTIONS``, no triton, a pip-installed
megatron-core (no Makefile for the dataset helpers), no nvcc, Megatron's default dropout 0.1.

The runs share work (each launch costs ~10 s of imports per process):

* ``uninterrupted``: TP2, dropout on, 4 iterations, torch_dist checkpoints at 2 and 4.
* exact resume: ``--load`` at iteration 2 and continue to 4, with dropout on, must reproduce
  iterations 3 and 4 bit for bit, from the torch_dist checkpoint and from a torch-format
  checkpoint written by a run that stopped at 2 (``--exit-interval 2``), as an interrupted job does.
* layouts: every layout loads the uninterrupted run's iteration-2 weights with ``--finetune``
  (weights only: a fresh optimizer, iteration 0, the same data; megatron-core's distributed
  checkpoint re-shards them), trains 4 iterations with dropout off, and is compared with the
  one-process run, iteration by iteration (fp32: measured within 1e-7 relative).
"""

from __future__ import annotations

import math

import pytest

from mlm_harness import TINY_GPT

pytestmark = pytest.mark.slow

ITERS = 4
MODEL = (*TINY_GPT, "--num-layers", "4", "--transformer-impl", "local", "--train-iters", str(ITERS))
NO_DROPOUT = ("--hidden-dropout", "0", "--attention-dropout", "0")
TP2 = ("--tensor-model-parallel-size", "2")


@pytest.fixture(scope="module")
def uninterrupted(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("uninterrupted")
    run = megatron_lm.run([*MODEL, *TP2, "--save", str(work / "ckpt"), "--save-interval", "2",
                           "--ckpt-format", "torch_dist"], work, nproc=2)
    run.checkpoint = work / "ckpt"
    return run


@pytest.fixture(scope="module")
def resumed_torch_dist(megatron_lm, uninterrupted, tmp_path_factory):
    return megatron_lm.run([*MODEL, *TP2, "--load", str(uninterrupted.checkpoint), "--ckpt-step", "2",
                            "--ckpt-format", "torch_dist"], tmp_path_factory.mktemp("resumed_dist"), nproc=2)


@pytest.fixture(scope="module")
def interrupted_torch(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("interrupted")
    run = megatron_lm.run([*MODEL, *TP2, "--save", str(work / "ckpt"), "--save-interval", "100",
                           "--exit-interval", "2", "--ckpt-format", "torch"], work, nproc=2)
    run.checkpoint = work / "ckpt"
    return run


@pytest.fixture(scope="module")
def resumed_torch(megatron_lm, interrupted_torch, tmp_path_factory):
    return megatron_lm.run([*MODEL, *TP2, "--load", str(interrupted_torch.checkpoint), "--ckpt-format", "torch"],
                           tmp_path_factory.mktemp("resumed_torch"), nproc=2)


def _finetune(megatron_lm, uninterrupted, tmp_path_factory, name, nproc, *extra):
    return megatron_lm.run([*MODEL, *NO_DROPOUT, "--load", str(uninterrupted.checkpoint), "--ckpt-step", "2",
                            "--finetune", "--ckpt-format", "torch_dist", *extra],
                           tmp_path_factory.mktemp(name), nproc=nproc)


@pytest.fixture(scope="module")
def reference(megatron_lm, uninterrupted, tmp_path_factory):
    return _finetune(megatron_lm, uninterrupted, tmp_path_factory, "one_process", 1)


@pytest.fixture(scope="module")
def pp2(megatron_lm, uninterrupted, tmp_path_factory):
    return _finetune(megatron_lm, uninterrupted, tmp_path_factory, "pp2", 2, "--pipeline-model-parallel-size", "2",
                     "--micro-batch-size", "1")


@pytest.fixture(scope="module")
def vpp(megatron_lm, uninterrupted, tmp_path_factory):
    # 8 microbatches in flight: what gave NaN at the first iteration before (gloo read freed sends)
    return _finetune(megatron_lm, uninterrupted, tmp_path_factory, "vpp", 2, "--pipeline-model-parallel-size", "2",
                     "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "1")


@pytest.fixture(scope="module")
def dp2_distopt_recompute(megatron_lm, uninterrupted, tmp_path_factory):
    return _finetune(megatron_lm, uninterrupted, tmp_path_factory, "dp2", 2, "--use-distributed-optimizer",
                     "--overlap-grad-reduce", "--overlap-param-gather", "--recompute-granularity", "full",
                     "--recompute-method", "uniform", "--recompute-num-layers", "1")


@pytest.fixture(scope="module")
def tp2_sp_bf16(megatron_lm, uninterrupted, tmp_path_factory):
    return _finetune(megatron_lm, uninterrupted, tmp_path_factory, "tp2sp", 2, *TP2, "--sequence-parallel", "--bf16")


def _falls(losses):
    return all(b < a for a, b in zip(losses, losses[1:]))


def _assert_same_run(run, reference, rel):
    assert run.iterations == reference.iterations, (run.iterations, reference.iterations)
    for got, want in zip(run.records, reference.records):
        i = got["iteration"]
        assert math.isfinite(got["losses"]["lm loss"]), f"iteration {i}: {got}"
        assert got["losses"]["lm loss"] == pytest.approx(want["losses"]["lm loss"], rel=rel), f"iteration {i} loss"
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=rel * 10), f"iteration {i} grad norm"


# --- what a first launch shows -------------------------------------------------------------------

def test_it_trains_with_none_of_the_cuda_tools(uninterrupted):
    assert uninterrupted.iterations == [1, 2, 3, 4]
    assert _falls(uninterrupted.losses), uninterrupted.losses
    out = uninterrupted.output
    assert ">>> done with dataset index builder" in out and "no makefile found" not in out
    assert ">>> done with compiling and loading fused kernels" in out
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in out  # TP2 without it: neither refused nor advised
    assert "successfully saved checkpoint" in out  # torch_dist: its writer starts a spawn child


def test_the_full_precision_log_is_what_megatron_prints(uninterrupted):
    # Megatron prints 7 significant digits; at iteration 2 it prints the mean of iterations 1 and 2
    # (its first log line does not reset the accumulator), from iteration 3 on each iteration's own
    losses, printed = uninterrupted.losses, uninterrupted.printed
    assert printed[1][0] == pytest.approx(losses[0], rel=1e-6)
    assert printed[2][0] == pytest.approx((losses[0] + losses[1]) / 2, rel=1e-6)
    assert printed[3][0] == pytest.approx(losses[2], rel=1e-6)
    for i in range(1, ITERS + 1):
        assert printed[i][1] == pytest.approx(uninterrupted.grad_norms[i - 1], abs=5e-4)


# --- exact resume with dropout on ----------------------------------------------------------------

def test_resuming_from_torch_dist_reproduces_the_run_bit_for_bit(uninterrupted, resumed_torch_dist):
    assert resumed_torch_dist.iterations == [3, 4]
    for i in (3, 4):
        assert resumed_torch_dist.record(i) == uninterrupted.record(i)


def test_resuming_an_interrupted_torch_format_run_reproduces_it_bit_for_bit(uninterrupted, interrupted_torch,
                                                                             resumed_torch):
    assert interrupted_torch.iterations == [1, 2]
    assert interrupted_torch.records == uninterrupted.records[:2]  # the format changes nothing before
    assert resumed_torch.iterations == [3, 4]
    for i in (3, 4):
        assert resumed_torch.record(i) == uninterrupted.record(i)


# --- every layout trains the same numbers --------------------------------------------------------

def test_the_one_process_reference_trains(reference):
    assert reference.iterations == [1, 2, 3, 4] and _falls(reference.losses), reference.losses


def test_pp2_equals_one_process(pp2, reference):
    _assert_same_run(pp2, reference, rel=1e-6)


def test_the_interleaved_schedule_trains_without_nan_and_equals_pp2(vpp, pp2, reference):
    assert "found NaN" not in vpp.output
    _assert_same_run(vpp, pp2, rel=1e-6)
    _assert_same_run(vpp, reference, rel=1e-6)


def test_dp2_distributed_optimizer_with_overlap_and_full_recompute_equals_one_process(dp2_distopt_recompute,
                                                                                     reference):
    _assert_same_run(dp2_distopt_recompute, reference, rel=1e-6)


def test_tp2_sequence_parallel_bf16_follows_fp32(tp2_sp_bf16, reference):
    losses = tp2_sp_bf16.losses
    assert tp2_sp_bf16.iterations == [1, 2, 3, 4] and _falls(losses), losses
    for got, want in zip(losses, reference.losses):
        assert got == pytest.approx(want, rel=2e-3)  # bf16 weights and activations (measured 2.5e-4)
