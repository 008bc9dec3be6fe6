"""Megatron -> Megatron conversions carry the vocabulary padding rows through, bit for bit.

Megatron-LM trains the padding rows of the word embeddings and the output layer (its cross
entropy runs over the padded vocabulary), so a re-write at another layout must keep them: the
source checkpoints here get random, non-zero padding rows (written with torch itself), and
the outputs are read back with ``torch.load`` / torch's own distributed-checkpoint loader.
Rows a larger target padding adds are zeros; an HF export still keeps the true vocabulary only,
which for a checkpoint Megatron-LM wrote follows its tokenizer's rules (NullTokenizer adds an id).
"""

from __future__ import annotations

import argparse
import os

import torch

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from loaders_tiny import hf_state

V, H = 300, 64  # loaders_tiny: vocabulary 300, hidden 64


def _rank_files(root):
    it = (root / "latest_checkpointed_iteration.txt").read_text()
    base = root / f"iter_{int(it):07d}"
    return {name: base / name / "model_optim_rng.pt" for name in sorted(os.listdir(base))}


def _load(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, weights_only=True)


def _stage_tensor(root, key, tp, pp_rank, pp):
    """``key`` of pipeline stage ``pp_rank``, its TP shards concatenated on dim 0."""
    files = _rank_files(root)
    names = [f"mp_rank_{t:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "") for t in range(tp)]
    return torch.cat([_load(files[n])["model"][key] for n in names])


def _set_padding(root, tp, pp, seed):
    """Random non-zero padding rows in every embedding / output-layer shard of an untied legacy checkpoint;
    the full padded tensors, key -> [padded, H]."""
    g = torch.Generator().manual_seed(seed)
    full = {}
    files = _rank_files(root)
    for key, stage in (("embedding.word_embeddings.weight", 0), ("output_layer.weight", pp - 1)):
        names = [f"mp_rank_{t:02d}" + (f"_{stage:03d}" if pp > 1 else "") for t in range(tp)]
        states = [_load(files[n]) for n in names]
        whole = torch.cat([s["model"][key] for s in states])
        whole[V:] = torch.randn(whole.shape[0] - V, H, generator=g)
        for s, n, shard in zip(states, names, whole.chunk(tp)):
            s["model"][key] = shard.clone()
            torch.save(s, files[n])
        full[key] = whole
    return full


def test_legacy_to_legacy_and_torch_dist_keep_trained_padding_rows(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("llama")  # untied: the embedding and the output layer each have padding rows
    src = tmp_path / "src"
    convert(hf, str(src), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2))  # padded to 512
    full = _set_padding(src, 2, 2, seed=1)
    emb, head = full["embedding.word_embeddings.weight"], full["output_layer.weight"]
    assert emb.shape == head.shape == (512, H) and torch.count_nonzero(emb[V:]) == (512 - V) * H
    assert not torch.equal(emb[V:], head[V:])

    # TP2 PP2 -> TP2 PP1: the same padded size, every padding row kept
    same = convert(str(src), str(tmp_path / "tp2"), "mg", "mg", ConvertOptions(target_tp=2, verify=True))
    assert same.verify.ok, same.verify.summary()
    assert torch.equal(_stage_tensor(tmp_path / "tp2", "embedding.word_embeddings.weight", 2, 0, 1), emb)
    assert torch.equal(_stage_tensor(tmp_path / "tp2", "output_layer.weight", 2, 0, 1), head)
    assert "the source's 212 vocabulary padding rows (after the 300 real ones) are kept unchanged" in same.summary()

    # -> TP1 PP1: Megatron pads 300 to 384 at TP1; the first 84 padding rows are the source's
    small = convert(str(src), str(tmp_path / "tp1"), "mg", "mg", ConvertOptions(verify=True))
    assert small.verify.ok, small.verify.summary()
    assert torch.equal(_stage_tensor(tmp_path / "tp1", "embedding.word_embeddings.weight", 1, 0, 1), emb[:384])
    assert torch.equal(_stage_tensor(tmp_path / "tp1", "output_layer.weight", 1, 0, 1), head[:384])
    assert "keeps the first 84 of the source's 212 vocabulary padding rows" in small.summary()
    assert "the last 128, which belong to no token, are dropped" in small.summary()

    # -> a larger padded vocabulary (divisor 384 at TP2: 768): the source's rows, then zeros
    big = convert(str(src), str(tmp_path / "big"), "mg", "mg",
                  ConvertOptions(target_tp=2, make_vocab_size_divisible_by=384, verify=True))
    assert big.verify.ok, big.verify.summary()
    for key, want in (("embedding.word_embeddings.weight", emb), ("output_layer.weight", head)):
        got = _stage_tensor(tmp_path / "big", key, 2, 0, 1)
        assert got.shape == (768, H) and torch.equal(got[:512], want), key
        assert torch.count_nonzero(got[512:]) == 0, key
    assert "adds 256 new padding rows, written as zeros" in big.summary()

    # -> torch_dist at TP2's padding: the global tensors torch's own loader reads hold the same rows
    import torch.distributed.checkpoint as dcp

    dist = convert(str(src), str(tmp_path / "dist"), "mg", "torch_dist", ConvertOptions(target_tp=2, verify=True))
    assert dist.verify.ok, dist.verify.summary()
    state = {"embedding.word_embeddings.weight": torch.empty(512, H), "output_layer.weight": torch.empty(512, H)}
    dcp.load(state, checkpoint_id=str(tmp_path / "dist" / "iter_0000001"), no_dist=True)
    assert torch.equal(state["embedding.word_embeddings.weight"], emb)
    assert torch.equal(state["output_layer.weight"], head)

    # HF has the true vocabulary only: the export drops the padding
    exported = convert(str(src), str(tmp_path / "hf"), "mg", "hf", ConvertOptions(verify=True))
    assert exported.verify.ok  # and the summary says which rows went, and why (they were dropped silently)
    assert ("note: wrote the 300 rows of the true vocabulary (as ascend-patch convert recorded it in the "
            "checkpoint) and dropped the source's 212 vocabulary padding rows after them (padded vocabulary 512), "
            "which belong to no token") in exported.summary()
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)


def test_torch_dist_to_legacy_keeps_trained_padding_rows(hf_checkpoint, tmp_path):
    """A torch_dist checkpoint torch itself wrote (whole global tensors), padded for TP2 with non-zero rows."""
    import torch.distributed.checkpoint as dcp

    hf, _ = hf_checkpoint("qwen3")  # tied: at PP > 1 the last stage's output layer is a copy of the embedding
    ours = tmp_path / "ours"
    convert(hf, str(ours), "hf", "torch_dist", ConvertOptions(target_tp=2))
    iter_dir = ours / "iter_0000001"
    from ascend_patch.loaders.torch_dist_io import read_dist_metadata

    stored = read_dist_metadata(str(iter_dir / ".metadata")).state_dict_metadata
    state = {k: torch.empty(tuple(v.size)) for k, v in stored.items() if hasattr(v, "chunks")}
    dcp.load(state, checkpoint_id=str(iter_dir), no_dist=True)
    emb = state["embedding.word_embeddings.weight"]
    assert emb.shape == (512, H) and torch.count_nonzero(emb[V:]) == 0  # an HF source has no padding values
    emb[V:] = torch.randn(512 - V, H, generator=torch.Generator().manual_seed(2))
    src = tmp_path / "src" / "iter_0000005"
    dcp.save(state, checkpoint_id=str(src), no_dist=True)
    (src / "common.pt").write_bytes((iter_dir / "common.pt").read_bytes())
    (tmp_path / "src" / "latest_checkpointed_iteration.txt").write_text("5")

    out = convert(str(tmp_path / "src"), str(tmp_path / "legacy"), "torch_dist", "mg",
                  ConvertOptions(target_tp=2, target_pp=2, verify=True))
    assert out.verify.ok, out.verify.summary()
    assert torch.equal(_stage_tensor(tmp_path / "legacy", "embedding.word_embeddings.weight", 2, 0, 2), emb)
    assert torch.equal(_stage_tensor(tmp_path / "legacy", "output_layer.weight", 2, 1, 2), emb)
    assert "212 vocabulary padding rows (after the 300 real ones) are kept unchanged" in out.summary()

    tp1 = convert(str(tmp_path / "src"), str(tmp_path / "tp1"), "torch_dist", "mg", ConvertOptions(verify=True))
    assert tp1.verify.ok, tp1.verify.summary()
    assert torch.equal(_stage_tensor(tmp_path / "tp1", "embedding.word_embeddings.weight", 1, 0, 1), emb[:384])


def _as_megatron_lm_wrote_it(root, **args):
    """Our legacy output as Megatron-LM writes it: no ascend_patch entry, these tokenizer arguments."""
    for path in _rank_files(root).values():
        state = _load(path)
        state.pop("ascend_patch", None)
        for name, value in args.items():
            setattr(state["args"], name, value)
        torch.save(state, path)


def test_a_null_tokenizer_checkpoint_keeps_its_end_of_document_row(hf_checkpoint, tmp_path):
    """Trained with --tokenizer-type NullTokenizer --vocab-size 299, Megatron's tokenizer has 300 ids (it adds
    the end-of-document id 299), so the HF export has 300 rows, the trained EOD row included, and says which
    rows it dropped and why; --vocab-size alone, for a tokenizer that reads its files, is refused."""
    import pytest

    from ascend_patch.loaders.preflight import PreflightError

    hf, _ = hf_checkpoint("qwen3")  # 300 tokens: row 299 plays the end-of-document row
    mg = tmp_path / "mg"
    convert(hf, str(mg), "hf", "mg", ConvertOptions(target_tp=2))  # padded to 512
    _as_megatron_lm_wrote_it(mg, tokenizer_type="NullTokenizer", vocab_size=299)
    out = tmp_path / "hf"
    result = convert(str(mg), str(out), "mg", "hf", ConvertOptions(verify=True))
    assert result.verify.ok and result.source.config.vocab_size == 300
    want, got = hf_state(hf), hf_state(str(out))
    assert got["model.embed_tokens.weight"].shape == (300, H)
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    assert ("note: wrote the 300 rows of the true vocabulary (--tokenizer-type NullTokenizer --vocab-size 299, "
            "plus the end-of-document id 299 Megatron's tokenizer adds) and dropped the source's 212 vocabulary "
            "padding rows after them (padded vocabulary 512), which belong to no token") in result.summary()

    # Megatron-LM main's NullTokenizer (its args carry null_tokenizer_eod_id) counts the EOD id in --vocab-size
    _as_megatron_lm_wrote_it(mg, null_tokenizer_eod_id=None, vocab_size=300)
    newer = convert(str(mg), str(tmp_path / "hf-newer"), "mg", "hf", ConvertOptions())
    assert newer.source.config.vocab_size == 300
    assert hf_state(str(tmp_path / "hf-newer"))["model.embed_tokens.weight"].shape == (300, H)

    # a tokenizer read from files: --vocab-size in the args is not its size, and nothing else says it
    _as_megatron_lm_wrote_it(mg, tokenizer_type="HuggingFaceTokenizer")
    with pytest.raises(PreflightError) as info:
        convert(str(mg), str(tmp_path / "refused"), "mg", "hf", ConvertOptions())
    assert info.value.codes() == ["vocab-unknown"]
    assert str(info.value.problems[0]) == (
        f"the true vocabulary of {mg} is unknown (--tokenizer-type HuggingFaceTokenizer reads its vocabulary from "
        "files, which the checkpoint does not hold): its 512 embedding rows include Megatron's padding, which a "
        "checkpoint without padding must not hold; pass --true-vocab-size N, the tokenizer's vocabulary "
        "(len(tokenizer); config.json's vocab_size of the model it was trained from)")
    assert not (tmp_path / "refused").exists()
    given = convert(str(mg), str(tmp_path / "given"), "mg", "hf", ConvertOptions(true_vocab_size=300))
    assert "(--true-vocab-size 300) and dropped the source's 212 vocabulary padding rows" in given.summary()
