"""A Qwen3-MoE checkpoint converted by ``ascend-patch convert`` at EP2 finetunes in Megatron-LM's pretrain_gpt.py.

As test_converted_qwen3.py does for the dense model: a tiny random Qwen3-MoE (8 experts, top-2) made
from a transformers config, converted with ``--target-expert-parallel-size 2`` (folders
``mp_rank_00_000`` / ``mp_rank_00_001``, four experts each), launched on 2 processes with the
arguments ``ascend-patch args`` prints (``--num-experts 8 --moe-router-topk 2 ...``) plus
``--spec qwen3_moe``, ``--expert-model-parallel-size 2 --load ... --finetune --ckpt-format torch``.
The data is one document repeating a random 64-token pattern, so every training window is known;
the first-iteration ``lm loss`` must equal transformers' cross entropy on it with the padded
vocabulary's zero logits appended (300 -> 384 rows at TP1). The load-balancing loss is reported
apart from the lm loss and does not enter it. fp32.
"""

from __future__ import annotations

import pytest
import torch

from mlm_harness import cli as _cli
from mlm_harness import padded_cross_entropy, run_converted, tiny_hf_model

pytestmark = pytest.mark.slow

SEQ, VOCAB, EP = 64, 300, 2
PADDED = 384


def _tiny_qwen3_moe(path):
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=128,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return tiny_hf_model(config, transformers.Qwen3MoeForCausalLM, path)


@pytest.fixture(scope="module")
def moe_run(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("qwen3_moe")
    model = _tiny_qwen3_moe(work / "hf")
    converted = run_converted(
        megatron_lm, work, model, VOCAB, SEQ, nproc=EP,
        convert=("--load-model-type", "hf", "--save-model-type", "mg", "--target-expert-parallel-size", str(EP)),
        launch=("--spec", "qwen3_moe", "--transformer-impl", "local", "--expert-model-parallel-size", str(EP),
                "--save", str(work / "trained"), "--save-interval", "2",
                "--hidden-dropout", "0", "--attention-dropout", "0"))
    return converted.run, converted.model_args, converted.logits, converted.labels, work


def test_the_printed_args_are_the_moe_model(moe_run):
    _, model_args, _, _, _ = moe_run
    given = dict(zip(model_args, model_args[1:]))
    assert (given["--num-experts"], given["--moe-router-topk"], given["--moe-ffn-hidden-size"]) == ("8", "2", "32")
    assert given["--moe-router-load-balancing-type"] == "aux_loss" and "--qk-layernorm" in model_args
    assert "--moe-router-pre-softmax" not in model_args  # norm_topk_prob: megatron's default routing


def test_megatron_lm_loads_the_ep2_checkpoint_and_gives_transformers_loss(moe_run):
    run, _, logits, labels, _ = moe_run
    expected = padded_cross_entropy(logits, labels, PADDED)
    first = run.record(1)["losses"]["lm loss"]
    assert first == pytest.approx(expected, rel=1e-5), first
    assert run.record(2)["losses"]["lm loss"] < first


def test_the_checkpoint_megatron_lm_saved_at_ep2_converts_to_hf_and_back_bit_for_bit(moe_run):
    """Megatron-LM's own legacy save after 2 iterations (mp_rank_00_000/001, optimizer state, no ascend_patch
    entry): mg -> hf reads each EP rank's local experts, and hf -> mg at EP2 rebuilds every model tensor
    of Megatron's files exactly (the vocabulary padding excepted: trimmed on export)."""
    import argparse
    import os

    _, _, _, _, work = moe_run
    trained = work / "trained"
    assert sorted(os.listdir(trained / "iter_0000002")) == ["mp_rank_00_000", "mp_rank_00_001"]
    hf = work / "trained_hf"
    _cli("convert", "--loader", "mg", "--saver", "hf", "--load-dir", str(trained), "--save-dir", str(hf),
         "--true-vocab-size", str(VOCAB), "--verify")
    _cli("convert", "--loader", "hf", "--saver", "mg", "--target-expert-parallel-size", str(EP), "--load-dir",
         str(hf), "--save-dir", str(work / "again"))
    for rank in ("mp_rank_00_000", "mp_rank_00_001"):
        with torch.serialization.safe_globals([argparse.Namespace]):
            ours = torch.load(work / "again" / "iter_0000001" / rank / "model_optim_rng.pt", weights_only=True)
        theirs = torch.load(trained / "iter_0000002" / rank / "model_optim_rng.pt", weights_only=False)
        mine = {k: v for k, v in ours["model"].items() if isinstance(v, torch.Tensor)}
        saved = {k: v for k, v in theirs["model"].items() if isinstance(v, torch.Tensor)}
        assert sorted(mine) == sorted(saved) and len(saved) > 20
        for key, tensor in saved.items():
            if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
                # rows past the true vocabulary are Megatron's padding: trained in its output layer, trimmed on
                # export, written back as zeros
                assert torch.equal(mine[key][:VOCAB], tensor[:VOCAB]) and not mine[key][VOCAB:].any(), (rank, key)
                continue
            assert torch.equal(mine[key], tensor), (rank, key)
