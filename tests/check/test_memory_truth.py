"""The estimate against real runs: every term of every rank, for launches that run for real on the cpu target.

Each launch runs twice: for real, under ``torchrun -m ascend_patch.check.memory.measure`` (Megatron-LM's own
pretrain_gpt.py, torch's MemTracker on real tensors, every rank's terms of its second iteration), and as the
estimate (one simulated rank per pipeline stage on fake tensors, fewer micro-batches where the schedule's peak
allows). Every rank's params, grads, optimizer state and activation peak must equal its role's estimate within
3 % (measured: params, grads and optimizer equal to the byte; activations within 1.8 %, see docs/memory.md).

The launches cover (2 or 4 processes, 2 iterations, the tiny GPT of the Megatron-LM tests, Megatron's
default dropout, ``--transformer-impl local`` unless said):

* ``tp2``: dense TP2 with selective recomputation;
* ``pp2vpp``: TP2 + sequence parallelism, PP2 with two virtual stages per rank (8 micro-batches; the
  estimate runs 6), full recomputation (uniform, 1 layer);
* ``cp2``: CP2 (the TE impl: context parallelism needs it);
* ``tp2_te`` and ``tp2_te_selective``: the ``tp2`` launch on the TE impl without dropout (flash-style attention:
  no S x S matrix is stored), without recomputation and with selective recomputation, which there saves little;
* ``moe_ep2``: 4 experts top-2 over EP2, alltoall dispatcher, grouped GEMM, dropless (the real routing is
  uneven; the estimate spreads tokens evenly), and DP2 with the distributed optimizer for the dense part.

The command itself runs once on the ``tp2`` launch, with the device's memory set one byte under the estimate:
the rank does not fit, and the changes it offers are re-estimated.
"""

from __future__ import annotations

import json
import re

import pytest

from memory_harness import TERMS, estimate, measure, megatron_lm_dir

pytestmark = pytest.mark.slow

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--micro-batch-size", "2", "--mock-data", "--tokenizer-type",
        "NullTokenizer", "--vocab-size", "128", "--lr", "1e-3", "--train-iters", "2", "--eval-iters", "0",
        "--eval-interval", "1000", "--seed", "1234"]
# Qwen3's and Llama's dropout: none. With attention dropout the cpu target's attention keeps the S x S dropout mask
# and probabilities (torch's flash kernel for cpu has no dropout), and selective recomputation frees them
NO_DROPOUT = ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
LAUNCHES = {
    "tp2": (2, ["--transformer-impl", "local", *TINY, "--global-batch-size", "8", "--tensor-model-parallel-size", "2",
                "--recompute-granularity", "selective"]),
    "pp2vpp": (4, ["--transformer-impl", "local", *TINY, "--global-batch-size", "16", "--tensor-model-parallel-size",
                   "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "1", "--recompute-granularity", "full",
                   "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
    "tp2_te": (2, ["--transformer-impl", "transformer_engine", *TINY, *NO_DROPOUT, "--global-batch-size", "8",
                   "--tensor-model-parallel-size", "2"]),
    "tp2_te_selective": (2, ["--transformer-impl", "transformer_engine", *TINY, *NO_DROPOUT, "--global-batch-size",
                             "8", "--tensor-model-parallel-size", "2", "--recompute-granularity", "selective"]),
    "cp2": (2, ["--transformer-impl", "transformer_engine", *TINY, "--global-batch-size", "8",
                "--context-parallel-size", "2"]),
    "moe_ep2": (2, ["--transformer-impl", "local", *TINY, "--global-batch-size", "8", "--expert-model-parallel-size",
                    "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type", "alltoall",
                    "--moe-grouped-gemm", "--moe-ffn-hidden-size", "64", "--disable-bias-linear",
                    "--use-distributed-optimizer"]),
}
# estimated only (compared with the estimate of a launch above): tp2 without its selective recomputation
ESTIMATED = {"tp2_local_none": (2, [a for a in LAUNCHES["tp2"][1] if a not in ("--recompute-granularity", "selective")])}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return megatron_lm_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, root):
    """name -> (measured per rank, estimated result) for every launch."""
    work = tmp_path_factory.mktemp("memory-truth")
    measured = {name: measure(root, args, nproc, work / name) for name, (nproc, args) in LAUNCHES.items()}
    every = {**LAUNCHES, **ESTIMATED}
    jobs = [{"launch": ["torchrun", "--nproc-per-node", str(nproc), str(root / "pretrain_gpt.py"), *args],
             "target": "cpu", "remedies": False} for nproc, args in every.values()]
    estimated = estimate(jobs, work / "estimate")
    return {name: (measured.get(name), result) for name, result in zip(every, estimated)}


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_every_rank_every_term_within_3_percent(runs, name):
    measured, result = runs[name]
    nproc = LAUNCHES[name][0]
    assert sorted(measured) == list(range(nproc))
    covered = sorted(r for role in result["roles"] for r in role["ranks"])
    assert covered == list(range(nproc))
    for role in result["roles"]:
        for rank in role["ranks"]:
            real = measured[rank]["terms"]
            for term in TERMS:
                assert real[term] > 0 and role[term] > 0, (name, rank, term)
                assert abs(role[term] - real[term]) <= 0.03 * real[term], (name, role["role"], rank, term,
                                                                           role[term], real[term])
        # the tensor terms add up to what the estimate reports, and the cpu target adds nothing else
        assert role["buffers_bytes"] == 0
        assert role["total_bytes"] == sum(role[t] for t in TERMS)


def test_state_terms_are_exact_and_the_pipeline_ran_fewer_micro_batches(runs):
    measured, result = runs["pp2vpp"]
    for role in result["roles"]:
        for rank in role["ranks"]:
            for term in ("params_bytes", "grads_bytes", "optimizer_bytes"):
                assert role[term] == measured[rank]["terms"][term]
        # 8 micro-batches really, 6 in the estimate: the interleaved schedule's peak is reached by then
        assert role["num_microbatches"] == 6 and measured[role["ranks"][0]]["num_microbatches"] == 8
    # the last stage's recorded pipeline peer is the first stage's rank with its TP coordinate
    assert [role["p2p_peers"] for role in result["roles"]] == [1, 1]


def test_selective_recompute_frees_no_s_by_s_matrix_when_the_attention_stores_none(runs):
    """Megatron's selective recomputation checkpoints core attention. The TE impl's attention without dropout
    (torch's flash kernel for cpu) saves q, k, v, its output and the softmax statistics, never the S x S scores:
    recomputing it frees the statistics and, where the output's layout change back to (s, b, h) is a copy (micro-batch
    > 1), the attention's own (b, s, h) output; the checkpoint keeps q, k, v (saved by the attention too) and the
    attention mask alive. The real runs free that much per layer and no more, and the estimate frees the same
    (docs/memory.md: at micro-batch 1, Qwen3-8B's selective recomputation saves 0)."""
    (none_real, none_est), (sel_real, sel_est) = runs["tp2_te"], runs["tp2_te_selective"]
    layers, b, heads, s, d = 4, 2, 4 // 2, 64, 16  # the tiny GPT: 4 heads of 16 over TP2, fp32
    per_layer = b * s * heads * d * 4 + b * heads * s * 4  # the (b, s, h) output and the statistics
    est_saved = none_est["roles"][0]["activations_bytes"] - sel_est["roles"][0]["activations_bytes"]
    for rank in none_real:
        real_none = none_real[rank]["terms"]["activations_bytes"]
        real_saved = real_none - sel_real[rank]["terms"]["activations_bytes"]
        assert 0 <= real_saved <= layers * per_layer, (rank, real_saved, layers * per_layer)
        assert abs(est_saved - real_saved) <= 0.01 * real_none, (rank, est_saved, real_saved)
    # the flag does reach the simulated model: the local impl's attention keeps (b, heads / TP, s, s) matrices
    # (its softmax output, the dropout mask and its result), and selective recomputation (the tp2 launch) frees
    # them, at least one fp32 matrix per layer
    local_none = runs["tp2_local_none"][1]["roles"][0]["activations_bytes"]
    local_selective = runs["tp2"][1]["roles"][0]["activations_bytes"]
    assert local_none - local_selective >= layers * b * heads * s * s * 4, (local_none, local_selective)


def test_the_distributed_optimizer_shards_the_optimizer_state_over_dp(runs):
    (_, dense), (_, moe) = runs["tp2"], runs["moe_ep2"]
    # fp32 training without it: Adam's two moments, 8 bytes per 4-byte parameter, on every rank
    assert dense["roles"][0]["optimizer_bytes"] == 2 * dense["roles"][0]["params_bytes"]
    # with it (moe_ep2: DP2 for the dense part, expert DP1 for the experts, EP2 x expert DP1 = 2 ranks), the
    # moments of the dense parameters are split over the two ranks and the rank's own experts keep theirs whole
    role = moe["roles"][0]
    numel = role["grads_bytes"] // 4  # the fp32 gradient buffers: one element per parameter of the rank
    layers, hidden, ffn, local_experts = 4, 64, 64, 4 // 2
    experts = layers * local_experts * 2 * hidden * ffn  # fc1 and fc2 of each local expert (gelu: no gate)
    assert role["optimizer_bytes"] == 8 * ((numel - experts) // 2 + experts)
    assert role["optimizer_bytes"] < 2 * role["params_bytes"]


def test_the_command_finds_the_rank_too_big_and_re_estimates_the_changes(runs, root, tmp_path, capsys):
    from ascend_patch.cli import main

    _, result = runs["tp2"]
    total = result["roles"][0]["total_bytes"]
    nproc, args = LAUNCHES["tp2"]
    code = main(["check", "--memory", "--device", "cpu", "--device-memory", str(total - 1), "--max-rows", "2", "--",
                 "torchrun", "--nproc-per-node", str(nproc), str(root / "pretrain_gpt.py"), *args])
    out = capsys.readouterr().out
    assert code == 1
    assert "every rank" in out and "0-1" in out and "1 B over" in out and "[memory-oom]" not in out
    # the same estimate again (deterministic), then each change, run: full recompute and a smaller micro-batch fit
    assert "total_bytes" not in out and str(total) not in out
    changes = {re.split(r"\s{2,}", line.strip())[0]: line for line in out.splitlines() if line.startswith("  --")}
    assert "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" in changes
    assert changes["--micro-batch-size 1"].endswith("fits")
    assert "each of these brings every rank under (re-estimated)" in out
    assert "0 on the cpu target" in out and "Nothing here was measured on an NPU." in out


def test_json_when_the_layout_is_wrong(root, capsys):
    from ascend_patch.cli import main

    code = main(["check", "--memory", "--format", "json", "--chip", "910B3", "--", "torchrun", "--nproc-per-node", "3",
                 str(root / "pretrain_gpt.py"), "--tensor-model-parallel-size", "2"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc == {"ranks": [], "device_bytes": 64 << 30, "fits": False}
