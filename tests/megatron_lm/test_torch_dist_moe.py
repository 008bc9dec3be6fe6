"""MoE in Megatron-LM's torch_dist format: our conversion trains in Megatron-LM, Megatron-LM's save converts back.

One training run on the launch line of a GPU cluster: a tiny random Qwen3-MoE (8 experts, top-2)
converted model-free from HF to torch_dist, loaded by the vendored pretrain_gpt.py with the default
(Transformer Engine) implementation, ``--moe-grouped-gemm`` and ``--expert-model-parallel-size 2``
(TEGroupedMLP: the experts' weights are ``linear_fc1.weight{x}`` per local expert, keyed in the
checkpoint on the expert axis of ``decoder.layers.mlp.experts.linear_fc1.weight``), 2 iterations,
``--ckpt-format torch_dist`` save. Then:

* the first loss is transformers' cross entropy on the known window (the padded vocabulary's zero
  logits appended): Megatron-LM read every expert from our file;
* ``ascend-patch convert --load-model-type mg`` turns Megatron-LM's save into HF, whose transformers
  logits equal the trained model's as megatron-core computes them after its own re-sharding loader
  (``dist_checkpointing.load`` at EP 1, SequentialMLP experts: tests/loaders/dist_logits_worker.py);
* our model-free re-write of that save (``--ckpt-format torch_dist``) gives megatron-core the same
  logits bit for bit, and Megatron-LM resumes it at TP1 x PP2 with EP 1 and the local spec — not the
  layout it was trained at — with the trained model's loss, and goes on training.

fp32 throughout; the data set repeats one 64-token pattern, so every window is known.
"""

from __future__ import annotations

import shlex

import numpy as np
import pytest
import torch

from mlm_harness import cli as _cli
from mlm_harness import export_and_rewrite, padded_cross_entropy, periodic_data
from test_converted_moe import EP, PADDED, SEQ, VOCAB, _tiny_qwen3_moe

pytestmark = pytest.mark.slow


def _train_args(model_args, work, load, *parallel, start=("--finetune",), iters=2):
    return [*model_args, "--spec", "qwen3_moe", *parallel, "--load", str(load), *start, "--ckpt-format", "torch_dist",
            "--hidden-dropout", "0", "--attention-dropout", "0",
            "--tokenizer-type", "NullTokenizer", "--data-path", str(work / "periodic"), "--split", "100,0,0",
            "--seq-length", str(SEQ), "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", str(iters),
            "--lr", "1e-4", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000"]


@pytest.fixture(scope="module")
def moe_dist_runs(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("torch_dist_moe")
    model = _tiny_qwen3_moe(work / "hf")
    pattern = np.random.default_rng(1).integers(0, VOCAB, SEQ)
    periodic_data(str(work / "periodic"), pattern)
    converted = _cli("convert", "--load-model-type", "hf", "--save-model-type", "mg", "--ckpt-format", "torch_dist",
                     "--target-expert-parallel-size", str(EP), "--load-dir", str(work / "hf"),
                     "--save-dir", str(work / "ours_from_hf"), "--verify")
    model_args = shlex.split(_cli("args", "--hf-config", str(work / "hf"), "--format", "argv"))
    trained = megatron_lm.run(_train_args(model_args, work, work / "ours_from_hf", "--moe-grouped-gemm",
                                          "--expert-model-parallel-size", str(EP), "--save", str(work / "megatron"),
                                          "--save-interval", "2"), work / "train", nproc=EP)
    dist = export_and_rewrite(work, "megatron", pattern)
    resumed = megatron_lm.run(_train_args(model_args, work, work / "ours", "--transformer-impl", "local",
                                          "--pipeline-model-parallel-size", "2",
                                          start=("--no-load-optim", "--no-load-rng"), iters=4),
                              work / "resumed", nproc=2)
    window = torch.tensor(np.concatenate([pattern, pattern[:1]]))
    with torch.no_grad():
        hf_before = model(window[None, :-1]).logits[0].double()
    import transformers

    exported_model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "exported")).eval()
    with torch.no_grad():
        hf_after = exported_model(torch.tensor(pattern)[None]).logits[0]
    return dict(converted=converted, trained=trained, exported=dist.exported, rewritten=dist.rewritten,
                megatron=dist.megatron_logits, ours=dist.our_logits, hf_before=hf_before, hf_after=hf_after,
                resumed=resumed, labels=window[1:], work=work)


def test_megatron_lm_trains_our_moe_torch_dist_at_ep2_with_grouped_gemm(moe_dist_runs):
    converted, trained, labels = moe_dist_runs["converted"], moe_dist_runs["trained"], moe_dist_runs["labels"]
    assert "verify OK" in converted
    expected = padded_cross_entropy(moe_dist_runs["hf_before"], labels, PADDED)
    print(f"first loss {trained.losses[0]!r}, transformers {expected!r}")
    assert trained.iterations == [1, 2]
    assert trained.losses[0] == pytest.approx(expected, rel=1e-5), (trained.losses[0], expected)
    assert trained.losses[1] < trained.losses[0]
    saved = sorted(p.name for p in (moe_dist_runs["work"] / "megatron" / "iter_0000002").iterdir())
    assert ".metadata" in saved and "common.pt" in saved and sum(n.endswith(".distcp") for n in saved) >= EP


def test_megatron_lm_moe_torch_dist_save_exports_the_trained_logits(moe_dist_runs):
    exported, megatron, hf = moe_dist_runs["exported"], moe_dist_runs["megatron"], moe_dist_runs["hf_after"]
    assert "source: torch_dist checkpoint of a qwen3_moe model (TP 1, PP 1, EP 2" in exported, exported
    assert "verify OK" in exported
    assert megatron.shape == (SEQ, PADDED)
    # Megatron-LM trained with NullTokenizer --vocab-size 300, whose 301st id is the end-of-document token it adds:
    # that row is the trained model's too and is exported; the padding after it is not
    assert hf.shape == (SEQ, VOCAB + 1)
    assert f"wrote the {VOCAB + 1} rows of the true vocabulary (--tokenizer-type NullTokenizer --vocab-size {VOCAB}" \
        in exported
    diff = (hf - megatron[:, :VOCAB + 1]).abs().max().item()
    print(f"exported logits vs megatron-core: max abs diff {diff:.3g}")
    assert diff < 1e-5, diff
    assert hf.abs().max().item() > 0.5  # not a comparison of near-zero logits
    # two iterations moved the weights: the export is the trained model, not the converted one
    assert (hf[:, :VOCAB].double() - moe_dist_runs["hf_before"]).abs().max().item() > 1e-4


def test_our_moe_torch_dist_rewrite_is_bit_identical_and_resumes_at_another_layout(moe_dist_runs):
    ours, megatron, resumed = moe_dist_runs["ours"], moe_dist_runs["megatron"], moe_dist_runs["resumed"]
    assert "verify OK" in moe_dist_runs["rewritten"]
    assert torch.equal(ours, megatron)
    assert resumed.iterations == [3, 4]
    expected = torch.nn.functional.cross_entropy(megatron.double(), moe_dist_runs["labels"]).item()
    print(f"resumed first loss {resumed.losses[0]!r}, megatron-core {expected!r}")
    assert resumed.losses[0] == pytest.approx(expected, rel=1e-5), (resumed.losses[0], expected)
    assert resumed.losses[1] < resumed.losses[0]
