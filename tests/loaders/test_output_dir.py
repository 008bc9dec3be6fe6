"""Where the converter writes: --force leaves exactly the new checkpoint; bad destinations are refused first."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ascend_patch.cli import main
from loaders_tiny import hf_state, make_model, save_model


def _from_pretrained_state(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("first,second,exchange", [("sharded", "single", True), ("single", "sharded", True),
                                                    ("single", "sharded", False)])
def test_force_into_an_hf_dir_leaves_exactly_the_new_checkpoint(tmp_path, capsys, monkeypatch, first, second,
                                                                 exchange):
    # issue 13 item 8: the other weight layout stayed behind and from_pretrained loaded the stale one
    if not exchange:  # a kernel or file system without renameat2(RENAME_EXCHANGE): two renames
        monkeypatch.setattr("ascend_patch.loaders.engine._exchange", lambda a, b: False)
    old = save_model(make_model("llama", seed=1), str(tmp_path / "old"))
    new = save_model(make_model("llama", seed=2), str(tmp_path / "new"))
    out = tmp_path / "out"
    size = {"sharded": "60KB", "single": "5GB"}
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", old, "--save-dir", str(out),
                 "--max-shard-size", size[first], "--no-progress"]) == 0
    (out / "tokenizer.json").write_text("{}")  # not a checkpoint file: kept
    capsys.readouterr()
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", new, "--save-dir", str(out),
                 "--max-shard-size", size[second], "--force", "--verify", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "verify OK" in text and "kept 1 entry that belong to no checkpoint: tokenizer.json" in text
    entries = sorted(os.listdir(out))
    weights = [e for e in entries if e.endswith((".safetensors", ".json")) and e not in ("config.json",
                                                                                        "tokenizer.json",
                                                                                        "generation_config.json")]
    if second == "single":
        assert weights == ["model.safetensors"]
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 1 and weights == sorted(shards + ["model.safetensors.index.json"])
    assert "tokenizer.json" in entries
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch")]
    got, want = _from_pretrained_state(str(out)), hf_state(new)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_verify_reads_the_file_transformers_loads(tmp_path, capsys):
    # a stale model.safetensors beside shards + index: transformers loads it, so verify must too
    src = save_model(make_model("llama", seed=2), str(tmp_path / "src"))
    out = tmp_path / "out"
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", src, "--save-dir", str(out),
                 "--max-shard-size", "60KB", "--no-progress"]) == 0
    stale = save_model(make_model("llama", seed=1), str(tmp_path / "stale"))
    os.link(os.path.join(stale, "model.safetensors"), out / "model.safetensors")
    capsys.readouterr()
    assert main(["verify", "--load-dir", str(out), "--source-dir", src]) == 1
    text = capsys.readouterr().out
    assert "verify FAILED" in text
    assert f"{out} holds model-00001-of-" in text and "besides model.safetensors, which transformers loads" in text
    assert "tensor(s) differ from the source" in text  # it compared model.safetensors, not the shards
