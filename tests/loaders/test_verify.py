"""Verification catches what silently breaks checkpoints; its key sets come from real megatron-core."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from ascend_patch.loaders.verify import verify


def _rank_file(mg, name="mp_rank_01_001"):
    return os.path.join(mg, "iter_0000001", name, "model_optim_rng.pt")


def _edit(path, fn):
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(path, weights_only=True)
    fn(state)
    torch.save(state, path)


@pytest.fixture
def converted(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("qwen2")
    mg = str(tmp_path / "mg")
    result = convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, verify=True))
    assert result.verify.ok, result.verify.summary()
    assert result.verify.key_sets_checked == 4 and result.verify.tensors_checked > 0
    return hf, mg


def test_a_changed_value_is_found(converted):
    hf, mg = converted

    def bump(state):
        state["model"]["decoder.layers.0.mlp.linear_fc1.weight"][3, 5] += 1e-3

    _edit(_rank_file(mg), bump)
    report = verify(mg, hf)
    assert not report.ok
    (p,) = [p for p in report.problems if p.code == "tensor-mismatch"]
    assert "mp_rank_01_001" in str(p) and "decoder.layers.0.mlp.linear_fc1.weight" in str(p)


def test_diverging_replicas_are_found_without_a_source(converted):
    _, mg = converted
    assert verify(mg).ok

    def bump(state):
        state["model"]["decoder.final_layernorm.weight"][0] += 1.0  # TP rank 1's replica of the final norm

    _edit(_rank_file(mg), bump)
    report = verify(mg, check_keys=False)
    assert [p.code for p in report.problems] == ["tensor-mismatch"]
    assert "decoder.final_layernorm.weight" in str(report.problems[0])


def test_missing_and_extra_keys_against_megatron_core(converted):
    hf, mg = converted

    def damage(state):
        del state["model"]["decoder.layers.1.self_attention.linear_qkv._extra_state"]
        state["model"]["decoder.layers.1.self_attention.extra_bias"] = torch.zeros(3)

    _edit(_rank_file(mg, "mp_rank_00_000"), damage)
    report = verify(mg, hf)
    codes = {p.code: str(p) for p in report.problems}
    assert "linear_qkv._extra_state" in codes["keys-missing"] and "megatron-core GPTModel" in codes["keys-missing"]
    assert "extra_bias" in codes["keys-unexpected"] or "extra_bias" in codes.get("unexpected-tensors", "")


@pytest.mark.parametrize("family,layout", [("qwen3", dict(tp=2, pp=2)), ("llama", dict(tp=1, pp=2, vpp=2)),
                                           ("qwen2", dict(tp=2, pp=1))])
def test_expected_keys_equal_the_weight_map_output(hf_checkpoint, family, layout):
    """megatron-core's own model (built on meta) has exactly the keys and shapes the converter writes."""
    from ascend_patch.loaders.hf import HFLoader
    from ascend_patch.loaders.mcore_keys import megatron_expected_state
    from ascend_patch.models.vocab import padded_vocab_size
    from ascend_patch.models.weightmap import TensorPlan
    from ascend_patch.parallel import Layout

    hf, _ = hf_checkpoint(family)
    src = HFLoader().open(hf, ConvertOptions())
    lay = Layout.build(src.config.num_layers, layout["tp"], layout["pp"], layout.get("vpp", 1))
    padded = padded_vocab_size(src.config.vocab_size, 128, lay.tp)
    for p in range(lay.pp):
        for v in range(lay.vpp):
            ours = {e.key: (e.shape if isinstance(e, TensorPlan) else None)
                    for e in src.weight_map.megatron_chunk(lay, 1 if lay.tp > 1 else 0, p, v, "local", padded)}
            assert megatron_expected_state(src.config, lay, p, v, "local", padded) == ours


def test_hf_output_key_set_is_checked_against_transformers(tmp_path, converted):
    hf, mg = converted
    out = str(tmp_path / "hf")
    result = convert(mg, out, "mg", "hf", ConvertOptions(verify=True))
    assert result.verify.ok and result.verify.key_sets_checked == 1
    from safetensors.torch import load_file, save_file

    state = load_file(os.path.join(out, "model.safetensors"))
    del state["model.layers.0.self_attn.k_proj.bias"]
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    report = verify(out, mg, check_keys=True)
    assert "keys-missing" in [p.code for p in report.problems]


def test_te_naming_output_verifies(tmp_path, hf_checkpoint):
    """TE key names (norms folded into linear_qkv / linear_fc1, core_attention extra state) pass the key check."""
    hf, _ = hf_checkpoint("qwen3")
    result = convert(hf, str(tmp_path / "te"), "hf", "mg", ConvertOptions(target_tp=2, naming="te", verify=True))
    assert result.verify.ok, result.verify.summary()
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(_rank_file(str(tmp_path / "te"), "mp_rank_00"), weights_only=True)
    assert state["args"].transformer_impl == "transformer_engine"
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in state["model"]
    assert "decoder.layers.0.self_attention.core_attention._extra_state" in state["model"]
