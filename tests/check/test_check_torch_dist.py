"""``check`` on torch_dist checkpoints: a partial or damaged save is reported before megatron-core trips on it."""

from __future__ import annotations

import importlib.util
import os

from helpers import REPO

from ascend_patch.check import probe_checkpoint
from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions


def _loaders_tiny():
    """The converter tests' tiny HF models (tests/loaders/loaders_tiny.py), without touching sys.path."""
    spec = importlib.util.spec_from_file_location("check_dist_loaders_tiny",
                                                  os.path.join(REPO, "tests", "loaders", "loaders_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_damaged_torch_dist_saves_are_findings(tmp_path):
    tiny = _loaders_tiny()
    hf = tiny.save_model(tiny.make_model("llama"), str(tmp_path / "hf"))
    convert(hf, str(tmp_path / "dist"), "hf", "torch_dist", ConvertOptions(target_tp=2))
    layout = probe_checkpoint(str(tmp_path / "dist"))
    assert layout.format == "torch_dist" and layout.problems == []
    assert (layout.tp, layout.pp, layout.args["num_layers"], layout.args["padded_vocab_size"]) == (1, 1, 4, 512)

    data = tmp_path / "dist" / "iter_0000001" / "__0_0.distcp"
    size = data.stat().st_size
    os.truncate(data, size - 1000)
    found = probe_checkpoint(str(tmp_path / "dist")).problems
    assert [f.code for f in found] == ["dist-truncated"]
    assert "1 data file(s) of" in found[0].message and "__0_0.distcp" in found[0].message

    data.unlink()
    found = probe_checkpoint(str(tmp_path / "dist")).problems
    assert [f.code for f in found] == ["dist-incomplete"]
    assert "lacks 1 data file(s) its .metadata names: __0_0.distcp" in found[0].message

    (tmp_path / "dist" / "iter_0000001" / ".metadata").unlink()
    found = probe_checkpoint(str(tmp_path / "dist")).problems
    assert [f.code for f in found] == ["dist-incomplete"] and "save did not finish" in found[0].message
