"""Every preflight error: raised before any work, with the numbers and the remedy, all at once."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ascend_patch.loaders.engine import convert, prepare
from ascend_patch.loaders.formats import ConvertOptions
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
    assert mqa.code == "groups-vs-tp" and "writes each rank's own KV heads and cannot replicate them" in str(mqa)
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
    assert not os.path.exists(save) or not os.path.isdir(save) or os.listdir(save) == [] or save.endswith("busy")
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
    err = _refused(tmp_path, hf, claimed={"qk_layernorm": True})
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


# -- problems of the source's files ------------------------------------------------------------

def _sharded(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("llama", max_shard_size="200KB")
    copy = tmp_path / "sharded"
    shutil.copytree(hf, copy)
    with open(copy / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert len(set(index["weight_map"].values())) > 1
    return copy, index


def test_index_listing_tensors_its_shards_lack(tmp_path, hf_checkpoint):
    copy, index = _sharded(tmp_path, hf_checkpoint)
    index["weight_map"]["model.layers.0.ghost.weight"] = next(iter(index["weight_map"].values()))
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    err = _refused(tmp_path, str(copy))
    problem = next(p for p in err.problems if p.code == "index-mismatch")
    assert "lists 1 tensor(s) its shards do not hold: model.layers.0.ghost.weight" in str(problem)
    assert "re-download" in str(problem)


def test_tensor_stored_in_two_shards(tmp_path, hf_checkpoint):
    from safetensors.torch import load_file, save_file

    copy, index = _sharded(tmp_path, hf_checkpoint)
    first, second = sorted(set(index["weight_map"].values()))[:2]
    a, b = load_file(str(copy / first)), load_file(str(copy / second))
    key = next(iter(a))
    b[key] = a[key].clone()
    save_file(b, str(copy / second), metadata={"format": "pt"})
    err = _refused(tmp_path, str(copy))
    problem = next(p for p in err.problems if p.code == "duplicate-tensor")
    assert key in str(problem) and first in str(problem) and second in str(problem) and "remove one copy" in str(problem)


def test_output_path_that_is_a_file_and_too_little_disk(tmp_path, hf_checkpoint, monkeypatch):
    import collections

    from ascend_patch.loaders import preflight

    hf, _ = hf_checkpoint("qwen2")
    a_file = tmp_path / "out.pt"
    a_file.write_text("not a directory")
    err = _refused(tmp_path, hf, save=str(a_file))
    assert "output-not-dir" in err.codes() and "choose a directory path" in str(err)
    assert a_file.read_text() == "not a directory"
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    err = _refused(tmp_path, hf)
    problem = next(p for p in err.problems if p.code == "disk-space")
    _, plan = prepare(hf, None, "hf", "mg", ConvertOptions())
    needed = plan.nbytes + sum(map(len, plan.side_files.values()))
    assert 100_000 < needed < 10**6  # a tiny model: its size reads in KB, not as 0.00 GB
    assert str(problem) == (f"the output needs {needed / 1e3:.1f} KB but {os.path.realpath(tmp_path)} has 1.0 KB "
                            "free; free space or choose another --save-dir")


@pytest.mark.parametrize("n,text", [(0, "0 bytes"), (1, "1 byte"), (999, "999 bytes"), (1000, "1.0 KB"),
                                    (153_600, "153.6 KB"), (999_949, "999.9 KB"), (2_500_000, "2.5 MB"),
                                    (14_200_000_000, "14.20 GB"), (3 * 10**12, "3.00 TB")])
def test_sizes_read_in_the_unit_that_fits(n, text):
    from ascend_patch.loaders.preflight import human_bytes

    assert human_bytes(n) == text


def _rewrite_rank_files(root, edit):
    """Load every rank file of a Megatron checkpoint, let ``edit(rel, state)`` change it, save it back."""
    import argparse

    import torch

    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".pt"):
                path = os.path.join(dirpath, name)
                with torch.serialization.safe_globals([argparse.Namespace]):
                    state = torch.load(path, weights_only=True)
                edit(os.path.relpath(dirpath, root), state)
                torch.save(state, path)


def _mg(tmp_path, hf_checkpoint, **layout):
    from ascend_patch.loaders.formats import ConvertOptions

    hf, _ = hf_checkpoint("qwen3")
    mg = tmp_path / "mg"
    convert(hf, str(mg), "hf", "mg", ConvertOptions(**layout))
    return mg


def test_megatron_args_and_layers_that_disagree_with_the_files(tmp_path, hf_checkpoint):
    mg = _mg(tmp_path, hf_checkpoint, target_tp=2)

    def edit(rel, state):
        state["args"].tensor_model_parallel_size = 4
        state["ascend_patch"]["hf_config"]["num_hidden_layers"] = 6

    _rewrite_rank_files(mg, edit)
    err = _refused(tmp_path, str(mg), loader="mg", saver="hf", save=str(tmp_path / "hf"))
    by_code = {p.code: str(p) for p in err.problems}
    assert "args.tensor_model_parallel_size is 4 but" in by_code["args-vs-files"] and "holds 2" in by_code["args-vs-files"]
    assert "the config says 6 layers but the rank files hold 4 (4)" in by_code["layers-vs-files"]
    assert "re-convert" in by_code["layers-vs-files"]


def test_megatron_rank_file_missing_a_tensor_or_a_chunk(tmp_path, hf_checkpoint):
    import torch

    mg = _mg(tmp_path, hf_checkpoint, target_tp=2, target_pp=2, target_vpp=2)

    def edit(rel, state):
        if rel.endswith("mp_rank_01_001"):
            del state["model1"]  # one virtual-pipeline chunk short
        if rel.endswith("mp_rank_01_000"):
            del state["model0"]["decoder.layers.0.mlp.linear_fc2.weight"]
            state["model0"]["decoder.layers.0.mlp.stray.weight"] = torch.zeros(3)

    _rewrite_rank_files(mg, edit)
    err = _refused(tmp_path, str(mg), loader="mg", saver="hf", save=str(tmp_path / "hf"))
    by_code = {p.code: str(p) for p in err.problems}
    assert "mp_rank_01_001" in by_code["vpp-mismatch"] and "holds 1 model chunks, rank 0 holds 2" in by_code["vpp-mismatch"]
    assert "decoder.layers.0.mlp.linear_fc2.weight" in by_code["missing-tensors"]
    assert "decoder.layers.0.mlp.stray.weight" in by_code["unexpected-tensors"]
    assert "down_proj.weight" in by_code["coverage"] and "not held by any rank file" in by_code["coverage"]


def test_config_dtype_that_the_tensors_do_not_have_is_noted(tmp_path, hf_checkpoint):
    from ascend_patch.loaders.formats import ConvertOptions
    from ascend_patch.loaders.hf import HFLoader

    hf, _ = hf_checkpoint("llama")
    copy = tmp_path / "declared"
    shutil.copytree(hf, copy)
    with open(copy / "config.json") as f:
        config = json.load(f)
    config["dtype"] = "bfloat16"
    (copy / "config.json").write_text(json.dumps(config))
    notes = HFLoader().open(str(copy), ConvertOptions()).notes
    assert any("config.json declares bfloat16 but the tensors are float32" in n for n in notes), notes


@pytest.mark.parametrize("target", ["../other/{shard}", "{abs}", "config.json", "sub/../{shard}"])
def test_index_entries_outside_the_checkpoint_or_of_another_kind_are_refused(tmp_path, hf_checkpoint, capsys, target):
    # issue 13 item 13: "../../other/model-00001.safetensors" was read silently (another checkpoint's
    # weights taken as this one's), and "config.json" gave an IndexError traceback
    from ascend_patch.cli import main

    copy, index = _sharded(tmp_path, hf_checkpoint)
    other = tmp_path / "other"
    shutil.copytree(copy, other)
    key, shard = next(iter(index["weight_map"].items()))
    name = target.format(shard=shard, abs=str(other / shard))
    index["weight_map"][key] = name
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "out"
    assert main(["convert", "--load-dir", str(copy), "--save-dir", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    path = f"{copy}/model.safetensors.index.json"
    if name == "config.json":
        assert (f"{path} lists 'config.json', which is not a .safetensors file: model.safetensors.index.json names "
                "only .safetensors shards; fix or re-download it") in err
    else:
        assert (f"{path} points outside its checkpoint directory ({name!r}); every file of a checkpoint lies in "
                f"{copy}: fix or re-download model.safetensors.index.json") in err
    assert "Traceback" not in err and not out.exists()
