"""Megatron-LM's pretrain_gpt.py, unchanged, with its default ``--transformer-impl transformer_engine`` on
ascend_patch's Transformer-Engine-compatible layer, and context parallelism through it.

* GPT-style at TP2 with sequence parallelism and llama-style (RoPE, SwiGLU, RMSNorm, GQA, untied) at
  TP1: the default impl trains with the numbers of ``--transformer-impl local`` (fp32, 1e-5 relative
  per iteration). The
  same initial weights come from the same seed and init order: the TE layers draw megatron's
  model-parallel RNG stream exactly as the local layers do (no checkpoint conversion). The GPT run
  keeps Megatron's default dropout (0.1, attention and hidden): on cpu the layer's attention is
  torch's SDPA, whose dropout mask has the shape and RNG stream of megatron's softmax dropout. The
  llama-style run has no dropout, as it is also the CP1 reference.
* CP2 with each ``--cp-comm-type`` (p2p, all_gather, a2a) and CP4 with a2a+p2p
  (``--hierarchical-context-parallel-sizes 2 2``, 4 processes) equal CP1 (the llama-style TE run).
  The CP runs use RoPE, no dropout (dropout masks depend on how the sequence is split).
* A GPT with learned absolute positions (tied, ``--use-cpu-initialization``, dropout 0) at CP2 x TP2
  with sequence parallelism (4 processes) equals CP1: its position embeddings (and, with
  ``--use-cpu-initialization``, every weight) come from the host generator, which on the cpu target
  is also the emulated CUDA generator Megatron's JIT warm-up draws TP/CP-sized tensors from. Before
  the warm-up left the host generator as seeded, the two runs started from different weights.
"""

from __future__ import annotations

import re

import pytest
import torch

from mlm_harness import TINY_GPT, wait_all

pytestmark = pytest.mark.slow

ITERS = ("--train-iters", "3")
LLAMA = ("--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--group-query-attention",
         "--num-query-groups", "2", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
         "--attention-dropout", "0.0", "--hidden-dropout", "0.0")
# a GPT with learned absolute positions, every weight from the host generator
LEARNED = (*TINY_GPT, *ITERS, "--use-cpu-initialization", "--attention-dropout", "0.0", "--hidden-dropout", "0.0")
CP_RUNS = {  # comm type -> (processes, extra arguments)
    "p2p": (2, ("--context-parallel-size", "2", "--cp-comm-type", "p2p")),
    "all_gather": (2, ("--context-parallel-size", "2", "--cp-comm-type", "all_gather")),
    "a2a": (2, ("--context-parallel-size", "2", "--cp-comm-type", "a2a")),
    "a2a+p2p": (4, ("--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                    "--hierarchical-context-parallel-sizes", "2", "2")),
}


def assert_same_numbers(got, expected, rel=1e-5):
    assert got.iterations == expected.iterations == [1, 2, 3]
    for a, b in zip(got.losses, expected.losses):
        assert abs(a - b) <= rel * abs(b), (got.losses, expected.losses)
    for a, b in zip(got.grad_norms, expected.grad_norms):
        assert abs(a - b) <= rel * abs(b), (got.grad_norms, expected.grad_norms)


@pytest.fixture(scope="module")
def gpt_tp2(megatron_lm, tmp_path_factory):
    base = (*TINY_GPT, *ITERS, "--tensor-model-parallel-size", "2", "--sequence-parallel")  # dropout 0.1
    te_dir = tmp_path_factory.mktemp("te-tp2")
    # the default impl (no --transformer-impl), saving its checkpoint to show the TE layout
    te = megatron_lm.run([*base, "--save", str(te_dir / "ckpt"), "--save-interval", "3", "--ckpt-format", "torch"],
                         te_dir, nproc=2)
    local = megatron_lm.run([*base, "--transformer-impl", "local"], tmp_path_factory.mktemp("local-tp2"), nproc=2)
    return te, local


@pytest.fixture(scope="module")
def one_process(megatron_lm, tmp_path_factory):
    """The module's three one-process launches, independent of each other: started side by side, as each
    uses one core (OMP_NUM_THREADS=1), they take about the time of two run one after the other."""
    launches = {
        "te-llama": megatron_lm.start([*TINY_GPT, *ITERS, *LLAMA], tmp_path_factory.mktemp("te-llama")),
        "local-llama": megatron_lm.start([*TINY_GPT, *ITERS, *LLAMA, "--transformer-impl", "local"],
                                         tmp_path_factory.mktemp("local-llama")),
        "learned-cp1": megatron_lm.start(list(LEARNED), tmp_path_factory.mktemp("learned-cp1")),
    }
    return dict(zip(launches, wait_all(*launches.values())))


@pytest.fixture(scope="module")
def llama(one_process):
    return one_process["te-llama"], one_process["local-llama"]


@pytest.fixture(scope="module")
def learned_positions(megatron_lm, one_process, tmp_path_factory):
    cp2_tp2 = megatron_lm.run([*LEARNED, "--context-parallel-size", "2", "--tensor-model-parallel-size", "2",
                               "--sequence-parallel"], tmp_path_factory.mktemp("learned-cp2-tp2"), nproc=4)
    return one_process["learned-cp1"], cp2_tp2


@pytest.fixture(scope="module")
def cp_runs(megatron_lm, tmp_path_factory):
    runs = {}

    def get(comm: str):
        if comm not in runs:
            nproc, extra = CP_RUNS[comm]
            runs[comm] = megatron_lm.run([*TINY_GPT, *ITERS, *LLAMA, *extra],
                                         tmp_path_factory.mktemp("cp-" + comm.replace("+", "-")), nproc=nproc)
        return runs[comm]

    return get


def test_default_impl_tp2_sp_trains_like_local(gpt_tp2):
    te, local = gpt_tp2
    assert_same_numbers(te, local)
    assert te.losses[2] < te.losses[1] < te.losses[0]


def test_default_impl_builds_te_modules_and_saves_tes_checkpoint_layout(gpt_tp2):
    te, _ = gpt_tp2
    state = torch.load(te.workdir / "ckpt" / "iter_0000003" / "mp_rank_01" / "model_optim_rng.pt",
                       map_location="cpu", weights_only=False)
    keys = set(state["model"])
    layer = "decoder.layers.0."
    # TE's names: the input norms live in linear_qkv / linear_fc1, and each TE module has _extra_state
    assert {layer + "self_attention.linear_qkv.layer_norm_weight", layer + "mlp.linear_fc1.layer_norm_bias",
            layer + "self_attention.core_attention._extra_state", layer + "mlp.linear_fc2._extra_state"} <= keys
    assert not any(".input_layernorm." in k for k in keys)
    assert state["args"].transformer_impl == "transformer_engine"
    assert tuple(state["model"][layer + "self_attention.linear_qkv.weight"].shape) == (96, 64)  # TP2 shard


def test_default_impl_llama_style_trains_like_local(llama):
    te, local = llama
    assert_same_numbers(te, local)
    assert te.losses[2] < te.losses[1] < te.losses[0]


@pytest.mark.parametrize("comm", list(CP_RUNS))
def test_context_parallel_equals_cp1_for_each_comm_type(cp_runs, llama, comm):
    cp1, _ = llama
    assert_same_numbers(cp_runs(comm), cp1)


def test_learned_positions_start_from_the_same_weights_at_cp2_tp2_as_at_cp1(learned_positions):
    cp1, cp2_tp2 = learned_positions
    assert re.search(r"position_embedding_type \.+ learned_absolute", cp1.output)  # Megatron's printed args
    assert_same_numbers(cp2_tp2, cp1)
    assert cp1.losses[2] < cp1.losses[1] < cp1.losses[0]
