"""Every preflight error: raised before any work, with the numbers and the remedy, all at once."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.preflight import (PreflightError, check_dtype, check_pipeline_split, check_tensor_split,
                                            check_vocab)


def test_layers_vs_pipeline_message_lists_valid_sizes():
    (p,) = check_pipeline_split(28, 8)
    assert p.code == "layers-vs-pp"
    assert str(p) == ("28 layers cannot be split over 8 pipeline stages; use --target-pipeline-parallel-size "
                      "1, 2, 4, 7, 14 or 28, or give --num-layer-list")
    assert check_pipeline_split(28, 8, num_layer_list=[4, 4, 4, 4, 3, 3, 3, 3]) == []
    (v,) = check_pipeline_split(28, 2, vpp=4)
    assert "2 pipeline stages x 4 virtual stages = 8 chunks" in str(v)
    assert "--virtual-pipeline-parallel-size 2, 7 or 14" in str(v)


def test_layer_list_errors():
    (p,) = check_pipeline_split(8, 3, num_layer_list=[4, 3])
    assert p.code == "layer-list" and "has 2 entries but there are 3 pipeline stages" in str(p)
    (p,) = check_pipeline_split(8, 2, num_layer_list=[4, 3])
    assert "sums to 7 but the model has 8 layers" in str(p)
    (p,) = check_pipeline_split(8, 2, vpp=2, num_layer_list=[4, 4])
    assert p.code == "layer-list" and "cannot be combined with virtual pipeline stages" in str(p)


def test_heads_groups_and_mlp_vs_tensor_parallel():
    problems = check_tensor_split(heads=12, groups=4, ffn=96, tp=8)
    assert [p.code for p in problems] == ["heads-vs-tp", "groups-vs-tp"]
    assert str(problems[0]) == ("12 attention heads cannot be split over 8 tensor-parallel ranks; use "
                                "--target-tensor-parallel-size 1, 2, 3, 4, 6 or 12; sizes that fit the heads, "
                                "query groups and FFN together: 1, 2 or 4")
    (mqa,) = check_tensor_split(heads=8, groups=1, ffn=64, tp=2)
    assert mqa.code == "groups-vs-tp" and "KV heads cannot be replicated" in str(mqa)
    assert str(mqa).endswith("together: 1")
    (ffn,) = check_tensor_split(heads=8, groups=8, ffn=100, tp=8)
    assert ffn.code == "ffn-vs-tp" and "FFN hidden size 100 cannot be split over 8" in str(ffn)
    assert str(ffn).endswith("together: 1, 2 or 4")


def test_vocab_and_dtype_checks():
    assert [p.code for p in check_vocab(300, 0, 2)] == ["vocab-divisor"]
    assert [p.code for p in check_vocab(300, 128, 1, padded=256)] == ["vocab-padded"]
    assert [p.code for p in check_dtype("int8", "float32")] == ["dtype"]
    assert [p.code for p in check_dtype(None, "int64")] == ["dtype-source"]


def _refused(tmp_path, hf, saver="mg", loader="hf", save=None, **kw):
    from ascend_patch.loaders.formats import ConvertOptions

    save = save or str(tmp_path / "out")
    with pytest.raises(PreflightError) as info:
        convert(hf, save, loader, saver, ConvertOptions(**kw))
    assert not os.path.exists(save) or os.listdir(save) == [] or save.endswith("busy")
    return info.value


def test_all_problems_are_reported_together_before_any_work(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("qwen3")  # 4 layers, 4 heads, 2 query groups
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "old.txt").write_text("x")
    err = _refused(tmp_path, hf, save=str(busy), target_tp=4, target_pp=3, model_type_hf="llama")
    codes = err.codes()
    for code in ("output-not-empty", "model-type-mismatch", "unexpected-tensors", "layers-vs-pp", "groups-vs-tp"):
        assert code in codes, (code, str(err))
    assert "4 layers cannot be split over 3 pipeline stages; use --target-pipeline-parallel-size 1, 2 or 4" in str(err)
    assert "--force" in str(err)
    assert os.listdir(busy) == ["old.txt"]
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch-partial")]


def test_missing_unexpected_and_misshaped_tensors(tmp_path, hf_checkpoint):
    from safetensors.torch import load_file, save_file

    hf, _ = hf_checkpoint("llama")
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    state = load_file(str(bad / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.extra.weight"] = state["model.norm.weight"].clone()
    state["model.layers.2.input_layernorm.weight"] = state["model.layers.2.input_layernorm.weight"][:10].clone()
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    err = _refused(tmp_path, str(bad))
    by_code = {p.code: str(p) for p in err.problems}
    assert "model.layers.1.mlp.up_proj.weight" in by_code["missing-tensors"]
    assert "model.layers.0.extra.weight" in by_code["unexpected-tensors"]
    assert "model.layers.2.input_layernorm.weight [10] (expected [64])" in by_code["shape-mismatch"]


def test_output_inside_source_and_bad_divisor(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("qwen2")
    err = _refused(tmp_path, hf, save=os.path.join(hf, "mg"), make_vocab_size_divisible_by=0)
    assert {"output-in-source", "vocab-divisor"} <= set(err.codes())


def test_flags_contradicting_the_config(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("llama")
    err = _refused(tmp_path, hf, extra={"claimed": {"qk_layernorm": True}})
    assert "flag-vs-config" in err.codes()


def test_old_and_new_config_styles_read_the_same(tmp_path, hf_checkpoint):
    from ascend_patch.loaders.formats import ConvertOptions
    from ascend_patch.loaders.hf import HFLoader

    new, _ = hf_checkpoint("qwen3")
    old, _ = hf_checkpoint("qwen3", old_style_config=True)
    with open(os.path.join(old, "config.json")) as f:
        raw = json.load(f)
    assert "torch_dtype" in raw and "rope_theta" in raw and "rope_parameters" not in raw
    a, b = HFLoader().open(new, ConvertOptions()), HFLoader().open(old, ConvertOptions())
    assert a.config.rotary_base == b.config.rotary_base == 1e6
    assert a.config.to_dict() == b.config.to_dict()
