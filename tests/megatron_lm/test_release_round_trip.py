"""The converter with each release's Megatron-LM: ours hf -> mg, that release trains and saves torch_dist, ours -> HF.

A tiny random Qwen3 converted by ``ascend-patch convert`` (legacy torch format, TP2) is loaded by the
release's own ``pretrain_gpt.py`` with the arguments ``ascend-patch args`` prints (``--spec qwen3``, our
layer spec, which asks megatron-core what it has), trains one iteration at TP2 and saves in the default
``torch_dist`` format. ``ascend-patch convert`` then reads that save (``--verify``) and writes HF; the HF
model's logits equal the ones megatron-core computes after loading the release's save with its own
re-sharding loader (tests/loaders/dist_logits_worker.py, at TP1). 0.16.1 does the same at TP2 PP2 in
test_torch_dist_qwen3.py; CI runs 0.12.1 (MindSpeed-LLM's), and ``--release-matrix all`` adds 0.14.0 and
0.17.1 (Ascend's newest stack).
"""

from __future__ import annotations

import shlex

import numpy as np
import pytest
import torch

from mlm_harness import export_and_rewrite
from test_converted_qwen3 import SEQ, VOCAB, _cli, _periodic_data, _tiny_qwen3
from test_torch_dist_qwen3 import _train_args

pytestmark = pytest.mark.slow

# CI: 0.12.1, the release whose round trip was broken (0.17.1's ran through before; it runs with 0.14.0's under
# --release-matrix all, keeping CI's share of the release tests within its budget)
ROUND_TRIP = [pytest.param("0.12.1"), pytest.param("0.14.0", marks=pytest.mark.release_matrix_full),
              pytest.param("0.17.1", marks=pytest.mark.release_matrix_full)]


@pytest.mark.parametrize("release", ROUND_TRIP)
def test_the_converter_round_trips_through_the_release(megatron_release, tmp_path, release):
    work = tmp_path
    _tiny_qwen3(work / "hf")
    pattern = np.random.default_rng(1).integers(0, VOCAB, SEQ)
    _periodic_data(str(work / "periodic"), pattern)
    _cli("convert", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
         "--target-tensor-parallel-size", "2", "--load-dir", str(work / "hf"), "--save-dir", str(work / "legacy"))
    model_args = shlex.split(_cli("args", "--hf-config", str(work / "hf"), "--tensor-model-parallel-size", "2",
                                  "--format", "argv"))
    mlm = megatron_release(release)
    trained = mlm.run(_train_args(model_args, work, 2, 1, work / "legacy", "--save", str(work / "megatron"),
                                  "--save-interval", "1", iters=1), work / "train", nproc=2)
    assert trained.iterations == [1] and np.isfinite(trained.losses[0])
    assert f"megatron-core {release}" in mlm.detected["describe"]

    dist = export_and_rewrite(work, "megatron", pattern)
    assert "source: torch_dist checkpoint of a qwen3 model (TP 2, PP 1" in dist.exported
    assert "verify OK" in dist.exported and "verify OK" in dist.rewritten
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "exported")).eval()
    with torch.no_grad():
        hf = model(torch.tensor(pattern)[None]).logits[0]
    megatron = dist.megatron_logits
    assert megatron.shape == (SEQ, 512)  # TP2's padded vocabulary, as the release saved it
    # NullTokenizer --vocab-size 300 has 301 ids (Megatron adds the end-of-document id 300): its row is exported
    assert hf.shape == (SEQ, VOCAB + 1)
    diff = (hf - megatron[:, :VOCAB + 1]).abs().max().item()
    assert diff < 1e-5, diff
    assert hf.abs().max().item() > 0.5  # not a comparison of near-zero logits
    assert torch.equal(dist.our_logits, megatron[:, :384])  # our torch_dist re-write, padded for TP1
