"""MoE conversion: qwen3_moe and mixtral with expert parallelism in Megatron's legacy layout.

Round trips HF -> mg -> HF bit-identical at (TP, PP, EP) in {(1,1,1), (2,1,2), (1,2,2), (2,2,2)};
what each rank file holds (its EP rank's experts numbered from 0, the router and the dense
parts replicated); mg -> mg re-sharding of experts; the key spellings of the TE spec's
SequentialMLP and TEGroupedMLP; and the preflight refusals, with their numbers and remedies.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from ascend_patch.loaders.preflight import PreflightError
from loaders_tiny import hf_state

LAYOUTS = [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]
EXPERTS = {"qwen3_moe": 8, "mixtral": 4}


def _rank_files(mg: str) -> dict[str, dict]:
    """rank folder -> its 'model' state dict, read with plain torch.load."""
    root = os.path.join(mg, "iter_0000001")
    out = {}
    for name in sorted(os.listdir(root)):
        with torch.serialization.safe_globals([argparse.Namespace]):
            out[name] = torch.load(os.path.join(root, name, "model_optim_rng.pt"), weights_only=True)
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("tp,pp,ep", LAYOUTS, ids=lambda v: str(v))
def test_hf_mg_hf_is_bit_identical(tmp_path, hf_checkpoint, family, tp, pp, ep):
    hf, _ = hf_checkpoint(family)
    mg, back = str(tmp_path / "mg"), str(tmp_path / "hf")
    convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=tp, target_pp=pp, target_ep=ep))
    result = convert(mg, back, "mg", "hf", ConvertOptions())
    assert (result.source.layout.tp, result.source.layout.pp, result.source.layout.ep) == (tp, pp, ep)
    original, returned = hf_state(hf), hf_state(back)
    assert set(original) == set(returned)
    for key, value in original.items():
        assert torch.equal(value, returned[key]), key
    with open(os.path.join(hf, "config.json")) as f, open(os.path.join(back, "config.json")) as g:
        assert json.load(f) == json.load(g)


def test_rank_files_hold_their_experts_numbered_locally(tmp_path, hf_checkpoint):
    """TP2 x PP1 x EP2: mp_rank_TT_EEE; EP rank e holds global experts [4e, 4e+4) as local 0..3, split on TP."""
    hf, _ = hf_checkpoint("qwen3_moe")
    mg = str(tmp_path / "mg")
    convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=2, target_ep=2))
    files = _rank_files(mg)
    assert list(files) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    src = hf_state(hf)
    for name, state in files.items():
        t, e = int(name[8:10]), int(name[11:14])
        model = state["model"]
        assert state["args"].expert_model_parallel_size == 2 and state["args"].num_experts == 8
        local = sorted({int(k.split(".")[6]) for k in model if ".local_experts." in k})
        assert local == [0, 1, 2, 3]
        for x in range(4):
            g = 4 * e + x
            fc1 = model[f"decoder.layers.1.mlp.experts.local_experts.{x}.linear_fc1.weight"]
            gate = src[f"model.layers.1.mlp.experts.{g}.gate_proj.weight"].chunk(2, 0)[t]
            up = src[f"model.layers.1.mlp.experts.{g}.up_proj.weight"].chunk(2, 0)[t]
            assert torch.equal(fc1, torch.cat([gate, up]))
            fc2 = model[f"decoder.layers.1.mlp.experts.local_experts.{x}.linear_fc2.weight"]
            assert torch.equal(fc2, src[f"model.layers.1.mlp.experts.{g}.down_proj.weight"].chunk(2, 1)[t])
            assert model[f"decoder.layers.1.mlp.experts.local_experts.{x}.linear_fc1._extra_state"] is None
        # the router and the norms are whole on every rank; attention is this TP rank's shard on both EP ranks
        assert torch.equal(model["decoder.layers.0.mlp.router.weight"], src["model.layers.0.mlp.gate.weight"])
        assert torch.equal(model["decoder.layers.0.pre_mlp_layernorm.weight"],
                           src["model.layers.0.post_attention_layernorm.weight"])
        other = files[f"mp_rank_{t:02d}_{1 - e:03d}"]["model"]
        assert torch.equal(model["decoder.layers.0.self_attention.linear_proj.weight"],
                           other["decoder.layers.0.self_attention.linear_proj.weight"])
        assert not any(".mlp.linear_fc" in k for k in model)


def test_mg_ep_resharding_equals_direct_conversion(tmp_path, hf_checkpoint):
    """mg TP2 x PP2 x EP2 -> mg TP1 x PP1 x EP4 holds exactly what converting HF at that layout writes."""
    hf, _ = hf_checkpoint("qwen3_moe")
    convert(hf, str(tmp_path / "src"), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, target_ep=2))
    convert(str(tmp_path / "src"), str(tmp_path / "ep4"), "mg", "mg", ConvertOptions(target_ep=4))
    convert(hf, str(tmp_path / "direct"), "hf", "mg", ConvertOptions(target_ep=4))
    resharded, direct = _rank_files(str(tmp_path / "ep4")), _rank_files(str(tmp_path / "direct"))
    assert list(resharded) == [f"mp_rank_00_{e:03d}" for e in range(4)] == list(direct)
    for name in direct:
        a, b = resharded[name]["model"], direct[name]["model"]
        assert list(a) == list(b)
        for key in b:
            assert (a[key] is None and b[key] is None) or torch.equal(a[key], b[key]), (name, key)


@pytest.mark.parametrize("grouped", [False, True], ids=["sequential", "te-grouped"])
def test_te_spec_expert_keys(tmp_path, hf_checkpoint, grouped):
    """TE spec: SequentialMLP keeps local_experts.N, TEGroupedMLP is linear_fc1.weightN; the MoE layer's
    pre-MLP norm is not folded into an fc1. Either converts back bit-identically."""
    hf, _ = hf_checkpoint("mixtral")
    mg, back = str(tmp_path / "mg"), str(tmp_path / "hf")
    naming = "te_grouped" if grouped else "te"
    convert(hf, mg, "hf", "mg", ConvertOptions(target_ep=2, naming=naming,
                                               moe_grouped_gemm=grouped))
    model = _rank_files(mg)["mp_rank_00_001"]["model"]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in model
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in model
    if grouped:
        assert {k for k in model if ".experts." in k and "layers.0." in k} == {
            *(f"decoder.layers.0.mlp.experts.linear_fc{n}.weight{x}" for n in (1, 2) for x in (0, 1)),
            "decoder.layers.0.mlp.experts.linear_fc1._extra_state", "decoder.layers.0.mlp.experts.linear_fc2._extra_state"}
    else:
        assert "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight" in model
    result = convert(mg, back, "mg", "hf", ConvertOptions())
    assert result.source.naming == naming
    original, returned = hf_state(hf), hf_state(back)
    assert set(original) == set(returned) and all(torch.equal(original[k], returned[k]) for k in original)


def test_preflight_refuses_expert_layouts_with_numbers_and_remedies(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("qwen3_moe")
    with pytest.raises(PreflightError) as info:
        convert(hf, str(tmp_path / "a"), "hf", "mg", ConvertOptions(target_ep=3, target_etp=1, target_tp=2,
                                                                   moe_grouped_gemm=True))
    text = str(info.value)
    assert set(info.value.codes()) == {"experts-vs-ep", "etp-vs-tp", "grouped-mlp"}
    assert "8 experts cannot be split over 3 expert-parallel ranks; use --target-expert-parallel-size 1, 2, 4 or 8" in text
    assert ("expert tensor-parallel size 1 differs from TP 2" in text
            and "use --target-expert-tensor-parallel-size 2 (or leave it out)" in text)
    assert "GroupedMLP" in text and "TEGroupedMLP" in text
    with pytest.raises(PreflightError) as info:  # each expert is 32 wide: TP 3 cannot split it (nor the heads)
        convert(hf, str(tmp_path / "b"), "hf", "mg", ConvertOptions(target_tp=3))
    assert "each expert's FFN hidden size (moe_intermediate_size) 32 cannot be split over 3 tensor-parallel ranks" \
        in str(info.value)
    dense, _ = hf_checkpoint("qwen3")
    with pytest.raises(PreflightError) as info:
        convert(dense, str(tmp_path / "c"), "hf", "mg", ConvertOptions(target_ep=2))
    assert info.value.codes() == ["ep-dense"]
    assert "--target-expert-parallel-size 2 was given but the model has no experts" in str(info.value)
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "c")


def test_megatron_lm_style_moe_checkpoint_converts_back_from_its_args(tmp_path, hf_checkpoint):
    """A checkpoint without the ascend_patch entry (as Megatron-LM writes it) is recognised as qwen3_moe by
    its args (num_experts) and its config.json is rebuilt with the router settings."""
    hf, _ = hf_checkpoint("qwen3_moe")
    mg = tmp_path / "mg"
    convert(hf, str(mg), "hf", "mg", ConvertOptions(target_ep=2))
    for name in os.listdir(mg / "iter_0000001"):
        path = mg / "iter_0000001" / name / "model_optim_rng.pt"
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, weights_only=True)
        del state["ascend_patch"]
        torch.save(state, path)
    back = str(tmp_path / "hf")
    result = convert(str(mg), back, "mg", "hf", ConvertOptions(true_vocab_size=300))
    assert result.source.spec.name == "qwen3_moe"
    with open(os.path.join(back, "config.json")) as f:
        config = json.load(f)
    assert (config["num_experts"], config["moe_intermediate_size"], config["num_experts_per_tok"],
            config["norm_topk_prob"]) == (8, 32, 2, True)
    original, returned = hf_state(hf), hf_state(back)
    assert set(original) == set(returned) and all(torch.equal(original[k], returned[k]) for k in original)


def test_verify_checks_experts_and_catches_swapped_ep_ranks(tmp_path, hf_checkpoint):
    """--verify on MoE: every expert tensor against the source, each rank file's keys against megatron-core's
    MoE GPTModel (TEGroupedMLP naming derived from it), the HF output's against transformers' file layout.
    Two EP ranks' files swapped have the same keys and shapes: only the tensor check can tell, and does."""
    from ascend_patch.loaders.verify import verify

    hf, _ = hf_checkpoint("qwen3_moe")
    mg = tmp_path / "mg"
    result = convert(hf, str(mg), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, target_ep=2,
                                                             naming="te_grouped", verify=True,
                                                             moe_grouped_gemm=True))
    assert result.verify.ok, result.verify.summary()
    assert result.verify.key_sets_checked == 8 and result.verify.tensors_checked > 8 * 2 * 4
    back = convert(str(mg), str(tmp_path / "hf"), "mg", "hf", ConvertOptions(verify=True))
    assert back.verify.ok and back.verify.key_sets_checked == 1, back.verify.summary()
    root = mg / "iter_0000001"
    a, b = root / "mp_rank_01_001_000" / "model_optim_rng.pt", root / "mp_rank_01_001_001" / "model_optim_rng.pt"
    os.rename(a, tmp_path / "swap")
    os.rename(b, a)
    os.rename(tmp_path / "swap", b)
    report = verify(str(mg), hf, loader="mg", source_loader="hf", check_keys=False)
    assert not report.ok
    [finding] = [p for p in report.problems if p.code == "tensor-mismatch"]
    assert "mp_rank_01_001_000" in finding.message and "local_experts" not in finding.message
    assert "mlp.experts.linear_fc1.weight0" in finding.message
