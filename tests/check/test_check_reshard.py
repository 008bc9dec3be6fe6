"""The re-shard command ``ascend-patch check`` prints runs, and its output passes ``check``."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys

import torch
from helpers import REPO, child_env

from ascend_patch.cli import main


def _loaders_tiny():
    """The converter tests' tiny HF models (tests/loaders/loaders_tiny.py), without touching sys.path."""
    spec = importlib.util.spec_from_file_location("check_loaders_tiny",
                                                  os.path.join(REPO, "tests", "loaders", "loaders_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _printed_command(out: str) -> str:
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.rstrip().endswith("Re-shard it first:"))
    return lines[at + 1].strip()


def _model_states(root: str) -> dict[str, dict[str, torch.Tensor]]:
    """rank folder -> its ``model`` state dict (tensors only)."""
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        tracker = f.read().strip()
    iteration = os.path.join(root, "release" if tracker == "release" else f"iter_{int(tracker):07d}")
    out = {}
    for rank in sorted(os.listdir(iteration)):
        state = torch.load(os.path.join(iteration, rank, "model_optim_rng.pt"), map_location="cpu",
                           weights_only=False)
        out[rank] = {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    return out


def test_printed_pp_reshard_command_runs_and_the_result_passes_check(tmp_path, capsys):
    from ascend_patch.loaders.engine import convert
    from ascend_patch.loaders.formats import ConvertOptions

    tiny = _loaders_tiny()
    hf = tiny.save_model(tiny.make_model("qwen3"), str(tmp_path / "hf"))  # 4 layers
    pp4 = str(tmp_path / "mg_pp4")
    convert(hf, pp4, "hf", "mg", ConvertOptions(target_pp=4))
    assert sorted(os.listdir(os.path.join(pp4, "iter_0000001"))) == [f"mp_rank_00_00{p}" for p in range(4)]

    assert main(["check", "--world-size", "1", "--hf-config", hf, "--load", pp4]) == 1
    out = capsys.readouterr().out
    assert "this checkpoint was saved with PP=4 but you are launching PP=1" in out
    command = _printed_command(out)
    argv = shlex.split(command)
    assert argv[:2] == ["ascend-patch", "convert"]
    bin_dir = os.path.dirname(sys.executable)  # the venv's ascend-patch console script
    env = child_env(PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    resharded = argv[argv.index("--save-dir") + 1]
    assert resharded == pp4 + "_tp1_pp1" and f"then launch with --load {resharded}" in out

    assert main(["check", "--world-size", "1", "--hf-config", hf, "--load", resharded]) == 0
    out = capsys.readouterr().out
    assert "saved TP=1 PP=1 EP=1" in out and out.rstrip().endswith("OK: no errors")

    # the re-sharded checkpoint holds what converting the HF model straight to PP=1 gives
    direct = str(tmp_path / "mg_pp1")
    convert(hf, direct, "hf", "mg", ConvertOptions())
    got, want = _model_states(resharded), _model_states(direct)
    assert list(got) == list(want) == ["mp_rank_00"]
    assert sorted(got["mp_rank_00"]) == sorted(want["mp_rank_00"])
    assert len(got["mp_rank_00"]) > 10
    for key, tensor in want["mp_rank_00"].items():
        assert torch.equal(got["mp_rank_00"][key], tensor), key


def test_printed_vpp_reshard_command_runs_and_the_result_passes_check(tmp_path, capsys):
    from ascend_patch.loaders.engine import convert
    from ascend_patch.loaders.formats import ConvertOptions

    tiny = _loaders_tiny()
    hf = tiny.save_model(tiny.make_model("llama"), str(tmp_path / "hf"))  # 4 layers
    vpp2 = str(tmp_path / "mg_pp2_vpp2")
    convert(hf, vpp2, "hf", "mg", ConvertOptions(target_pp=2, target_vpp=2))
    assert main(["check", "--world-size", "2", "--pp", "2", "--hf-config", hf, "--load", vpp2]) == 1
    out = capsys.readouterr().out
    assert "this checkpoint was saved with VPP=2 but you are launching VPP=1" in out
    argv = shlex.split(_printed_command(out))
    assert argv[-2:] == ["--virtual-pipeline-parallel-size", "1"]
    env = child_env(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    resharded = argv[argv.index("--save-dir") + 1]
    assert main(["check", "--world-size", "2", "--pp", "2", "--hf-config", hf, "--load", resharded]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK: no errors")
    direct = str(tmp_path / "mg_pp2")
    convert(hf, direct, "hf", "mg", ConvertOptions(target_pp=2))
    got, want = _model_states(resharded), _model_states(direct)
    assert list(got) == list(want) == ["mp_rank_00_000", "mp_rank_00_001"]
    for rank, state in want.items():
        assert sorted(got[rank]) == sorted(state)
        for key, tensor in state.items():
            assert torch.equal(got[rank][key], tensor), (rank, key)


def test_printed_ep_reshard_command_runs_and_the_result_passes_check(tmp_path, capsys):
    """A qwen3_moe checkpoint saved at EP2 checked for an EP1 launch: the printed command re-shards the
    experts and its output equals converting the HF model straight to EP1."""
    from ascend_patch.loaders.engine import convert
    from ascend_patch.loaders.formats import ConvertOptions

    tiny = _loaders_tiny()
    hf = tiny.save_model(tiny.make_model("qwen3_moe"), str(tmp_path / "hf"))  # 8 experts
    ep2 = str(tmp_path / "mg_ep2")
    convert(hf, ep2, "hf", "mg", ConvertOptions(target_ep=2))
    assert main(["check", "--world-size", "1", "--hf-config", hf, "--load", ep2]) == 1
    out = capsys.readouterr().out
    assert "this checkpoint was saved with EP=2 but you are launching EP=1" in out
    argv = shlex.split(_printed_command(out))
    assert argv[-2:] == ["--target-expert-parallel-size", "1"]
    env = child_env(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    resharded = argv[argv.index("--save-dir") + 1]
    assert main(["check", "--world-size", "1", "--hf-config", hf, "--load", resharded]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK: no errors")
    direct = str(tmp_path / "mg_ep1")
    convert(hf, direct, "hf", "mg", ConvertOptions())
    got, want = _model_states(resharded), _model_states(direct)
    assert list(got) == list(want) == ["mp_rank_00"]
    assert sorted(got["mp_rank_00"]) == sorted(want["mp_rank_00"])
    assert sum(".local_experts.7.linear_fc1.weight" in k for k in want["mp_rank_00"]) == 4  # every layer, all 8
    for key, tensor in want["mp_rank_00"].items():
        assert torch.equal(got["mp_rank_00"][key], tensor), key
