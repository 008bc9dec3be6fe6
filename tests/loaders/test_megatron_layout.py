"""Megatron's checkpoint directory names, spelled in one module and read back by it."""

from __future__ import annotations

import pytest

from ascend_patch.loaders.blocks import CorruptCheckpoint
from ascend_patch.loaders import megatron_layout as ml


def test_rank_folders_as_megatron_names_them():
    assert ml.rank_dir(1) == "mp_rank_01"
    assert ml.rank_dir(1, 2, pp=4) == "mp_rank_01_002"
    assert ml.rank_dir(0, 0, 3, pp=1, ep=4) == "mp_rank_00_003"
    assert ml.rank_dir(1, 2, 3, pp=4, ep=4) == "mp_rank_01_002_003"
    assert ml.rank_dirs(2, 2) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    for tp, pp, ep in ((2, 1, 1), (2, 3, 1), (1, 1, 4), (2, 2, 2)):
        for name in ml.rank_dirs(tp, pp, ep):
            t, p, e = ml.rank_coordinates(ml.parse_rank_dir(name), pp, ep)
            assert ml.rank_dir(t, p, e, pp=pp, ep=ep) == name  # read back as written
    assert ml.parse_rank_dir("mp_rank_00_001") == (0, 1, None)
    assert ml.rank_coordinates((0, 1, None)) == (0, 1, 0)  # without sizes a two-part name is PP
    assert ml.parse_rank_dir("mp_rank_0") is None and ml.parse_rank_dir("mp_rank_00_01") is None


def test_iterations_tracker_and_format(tmp_path):
    assert ml.iteration_dir(100) == "iter_0000100" and ml.iteration_dir("release") == "release"
    assert ml.iteration_of("iter_0000100") == 100 and ml.iteration_of("release") == "release"
    assert ml.iteration_of("iter_x") is None
    for name in ("iter_0000100", "iter_0000020", "release", "iter_bad"):
        (tmp_path / name).mkdir()
    (tmp_path / "iter_0000300").write_text("not a folder")
    assert ml.iteration_dirs(str(tmp_path)) == ["iter_0000020", "iter_0000100", "release"]
    (tmp_path / ml.TRACKER).write_text("20\n")
    assert ml.read_tracker(str(tmp_path)) == 20
    (tmp_path / ml.TRACKER).write_text("release")
    assert ml.read_tracker(str(tmp_path)) == "release"
    (tmp_path / ml.TRACKER).write_text("latest")
    with pytest.raises(CorruptCheckpoint, match="holds 'latest', neither an iteration number nor 'release'"):
        ml.read_tracker(str(tmp_path))
    assert not ml.is_distributed(str(tmp_path / "iter_0000100"))
    (tmp_path / "iter_0000100" / "__0_0.distcp").write_bytes(b"")
    assert ml.is_distributed(str(tmp_path / "iter_0000100"))


def test_model_chunks():
    assert ml.chunk_names({"args": 1, "model": {}}) == ["model"]
    assert ml.chunk_names({"model10": {}, "model2": {}, "model0": {}, "modelx": {}}) == ["model0", "model2", "model10"]
    assert ml.chunk_names({"optimizer": {}}) == []
    assert ml.chunk_index("model") == 0 and ml.chunk_index("model12") == 12
    with pytest.raises(ValueError, match="not a model chunk name"):
        ml.chunk_index("optimizer")
