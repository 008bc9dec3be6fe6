"""Megatron-LM's own torch_dist checkpoint -> HF, and our torch_dist output back into Megatron-LM at another TP/PP.

One training run: a tiny random Qwen3 converted to the legacy format (TP2 PP2) trains 2
iterations in the vendored pretrain_gpt.py with ``--ckpt-format torch_dist`` and saves. Then:

* ``ascend-patch convert --load-model-type mg`` (it recognises torch_dist) writes HF; its logits
  in transformers equal the trained model's, as megatron-core computes them after loading the
  checkpoint with its own re-sharding loader (``dist_checkpointing.load``, at TP1 PP1, in
  tests/loaders/dist_logits_worker.py).
* ``ascend-patch convert --ckpt-format torch_dist`` re-writes the trained checkpoint model-free,
  padded for TP1 (384 rows; Megatron-LM saved TP2's 512): megatron-core's loader gets bit-identical
  logits from it over the whole TP1 padded vocabulary, the padding rows Megatron-LM trained
  included. Megatron-LM then resumes at TP1 PP2 — not the TP2 PP2 it was trained at — at iteration
  3 (``--no-load-optim --no-load-rng``: the saved args pass Megatron-LM's check_checkpoint_args)
  twice, from its own checkpoint and from our re-write: the first losses are equal (Megatron's
  cross entropy runs over the padded vocabulary, so zero padding would show), and training goes on.

The data set repeats one 64-token pattern, so every training window is known (see
test_converted_qwen3.py). fp32 throughout.
"""

from __future__ import annotations

import shlex

import numpy as np
import pytest
import torch

from mlm_harness import export_and_rewrite
from test_converted_qwen3 import SEQ, VOCAB, _cli, _periodic_data, _tiny_qwen3

pytestmark = pytest.mark.slow


def _train_args(model_args, work, tp, pp, load, *extra, start=("--finetune",), iters=2):
    return [*model_args, "--spec", "qwen3", "--transformer-impl", "local",
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--load", str(load), *start, "--ckpt-format", "torch_dist",
            "--hidden-dropout", "0", "--attention-dropout", "0",
            "--tokenizer-type", "NullTokenizer", "--data-path", str(work / "periodic"), "--split", "100,0,0",
            "--seq-length", str(SEQ), "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", str(iters),
            "--lr", "1e-4", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000", *extra]


@pytest.fixture(scope="module")
def dist_runs(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("torch_dist")
    _tiny_qwen3(work / "hf")
    pattern = np.random.default_rng(1).integers(0, VOCAB, SEQ)
    _periodic_data(str(work / "periodic"), pattern)
    _cli("convert", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
         "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
         "--load-dir", str(work / "hf"), "--save-dir", str(work / "legacy"))
    model_args = shlex.split(_cli("args", "--hf-config", str(work / "hf"), "--tensor-model-parallel-size", "2",
                                  "--format", "argv"))
    trained = megatron_lm.run(_train_args(model_args, work, 2, 2, work / "legacy", "--save", str(work / "megatron"),
                                          "--save-interval", "2"), work / "train", nproc=4)
    dist = export_and_rewrite(work, "megatron", pattern)
    # a resume, not --finetune: Megatron-LM checks the saved args against the launch's and goes on from
    # iteration 2 (the checkpoint holds no optimizer or RNG state, which the flags say)
    resume = ("--no-load-optim", "--no-load-rng")
    resumed = megatron_lm.run(_train_args(model_args, work, 1, 2, work / "ours", start=resume, iters=4),
                              work / "resumed", nproc=2)
    # the reference: Megatron-LM resuming its own checkpoint at the same TP1 PP2 (one iteration is enough)
    own = megatron_lm.run(_train_args(model_args, work, 1, 2, work / "megatron", start=resume, iters=3),
                          work / "own", nproc=2)

    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "exported")).eval()
    with torch.no_grad():
        hf_logits = model(torch.tensor(pattern)[None]).logits[0]
    labels = torch.tensor(np.concatenate([pattern[1:], pattern[:1]]))
    return dict(trained=trained, exported=dist.exported, rewritten=dist.rewritten,
                megatron=dist.megatron_logits, ours=dist.our_logits,
                hf=hf_logits, resumed=resumed, own=own, labels=labels)


def test_megatron_lm_saved_torch_dist_after_training(dist_runs):
    trained = dist_runs["trained"]
    assert trained.iterations == [1, 2] and trained.losses[1] < trained.losses[0]
    assert "source: torch_dist checkpoint of a qwen3 model (TP 2, PP 2" in dist_runs["exported"]
    assert "verify OK" in dist_runs["exported"] and "verify OK" in dist_runs["rewritten"]


def test_the_exported_hf_model_has_the_trained_logits(dist_runs):
    megatron, hf = dist_runs["megatron"], dist_runs["hf"]
    assert megatron.shape == (SEQ, 512)  # TP2's padded vocabulary, as Megatron-LM saved it
    # NullTokenizer --vocab-size 300 has 301 ids (Megatron adds the end-of-document id 300): its row is trained
    # and exported with the others
    assert hf.shape == (SEQ, VOCAB + 1)
    diff = (hf - megatron[:, :VOCAB + 1]).abs().max().item()
    assert diff < 1e-5, diff
    assert hf.abs().max().item() > 0.5  # the comparison is not between near-zero logits
    # Megatron-LM trained its padding rows a little; the export keeps the true vocabulary only (and says so)
    assert 0 < megatron[:, VOCAB + 1:].abs().max().item() < 0.05
    assert ("dropped the source's 211 vocabulary padding rows after them (padded vocabulary 512)"
            in dist_runs["exported"])


def test_our_torch_dist_holds_the_trained_weights_bit_for_bit(dist_runs):
    ours, megatron = dist_runs["ours"], dist_runs["megatron"]
    assert ours.shape == (SEQ, 384)  # padded for TP1 (--target-tensor-parallel-size 1, the default)
    # the trained padding rows too: the first 84 of Megatron-LM's 212
    assert torch.equal(ours, megatron[:, :384])
    assert torch.count_nonzero(ours[:, VOCAB:]) == SEQ * (384 - VOCAB)
    assert "keeps the first 83 of the source's 211 vocabulary padding rows" in dist_runs["rewritten"]


def test_megatron_lm_continues_from_our_torch_dist_as_from_its_own(dist_runs):
    resumed, own, labels = dist_runs["resumed"], dist_runs["own"], dist_runs["labels"]
    assert resumed.iterations == [3, 4] and own.iterations == [3]
    assert resumed.losses[0] == own.losses[0]
    # and that loss is the trained model's over TP1's padded vocabulary, trained padding rows included
    expected = torch.nn.functional.cross_entropy(dist_runs["megatron"][:, :384].double(), labels).item()
    assert resumed.losses[0] == pytest.approx(expected, rel=1e-6)
    hf = dist_runs["hf"].double()
    zero_padding = torch.cat([hf, torch.zeros(SEQ, 384 - hf.shape[1], dtype=torch.double)], dim=1)
    assert abs(torch.nn.functional.cross_entropy(zero_padding, labels).item() - expected) > 1e-4
    assert resumed.losses[1] < resumed.losses[0]
