"""``ascend-patch check``: the rank table and every inconsistency before launch, exit status 1 on errors."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import enum
import importlib.util
import json
import sys
import types

import pytest
import torch

from ascend_patch.cli import main
from ascend_patch.check import convert_command, preflight, probe_checkpoint


def make_checkpoint(root, tp=1, pp=1, ep=1, iteration=100, args=None, skip=(), with_args=True, vpp=1,
                    megatron_enum=False):
    """A legacy-format Megatron checkpoint: tracker file and iter_XXXXXXX/mp_rank_TT[_PPP][_EEE]/.

    ``vpp`` > 1 stores ``model0``, ``model1``, ... as Megatron does for virtual pipeline chunks;
    ``megatron_enum`` puts a Megatron enum member in ``args`` (see :func:`absent_megatron_enum`).
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    values = dict(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
                  num_layers=8, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  group_query_attention=True, ffn_hidden_size=128,
                  virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    values.update(args or {})
    with absent_megatron_enum() if megatron_enum else contextlib.nullcontext() as enum:
        if enum is not None:
            values["attention_backend"] = enum.auto
        for t in range(tp):
            for p in range(pp):
                for e in range(ep):
                    name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + (f"_{e:03d}" if ep > 1 else "")
                    if name in skip:
                        continue
                    folder = root / f"iter_{iteration:07d}" / name
                    folder.mkdir(parents=True)
                    state = {"iteration": iteration, "checkpoint_version": 3.0}
                    if vpp > 1:
                        state.update({f"model{v}": {"w": torch.zeros(2)} for v in range(vpp)})
                    else:
                        state["model"] = {"w": torch.zeros(2)}
                    if with_args:
                        state["args"] = argparse.Namespace(**values)
                    torch.save(state, folder / "model_optim_rng.pt")
    return root


ENUM_MODULE = "megatron.training.enums"  # Megatron-LM's, absent here (only megatron-core is installed)


@contextlib.contextmanager
def absent_megatron_enum():
    """An ``AttnBackend`` enum importable as ``megatron.training.enums.AttnBackend`` only inside the block.

    Pickles made inside reference that class by name; outside, loading them would need a
    class this process cannot import.
    """
    saved = {name: sys.modules.get(name) for name in ("megatron.training", ENUM_MODULE)}
    assert saved[ENUM_MODULE] is None and importlib.util.find_spec("megatron.training") is None
    enum_module = types.ModuleType(ENUM_MODULE)
    backend = enum.Enum("AttnBackend", {"flash": 1, "fused": 2, "unfused": 3, "local": 4, "auto": 5},
                        module=ENUM_MODULE, qualname="AttnBackend")
    enum_module.AttnBackend = backend
    sys.modules["megatron.training"] = types.ModuleType("megatron.training")
    sys.modules[ENUM_MODULE] = enum_module
    try:
        yield backend
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def hf_config(tmp_path, layers=8, heads=4, kv=2, ffn=128):
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=64, intermediate_size=ffn, num_attention_heads=heads, num_key_value_heads=kv,
                      num_hidden_layers=layers, vocab_size=1000, max_position_embeddings=256)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(tmp_path / "hf")
    return str(tmp_path / "hf" / "config.json")


def run(capsys, *argv):
    code = main(["check", *map(str, argv)])
    return code, capsys.readouterr().out


def test_help_shows_the_short_forms_readme_uses(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    usage = text.split("\n\n", 1)[0]
    for short, long in (("--tp", "--tensor-model-parallel-size"), ("--pp", "--pipeline-model-parallel-size"),
                        ("--cp", "--context-parallel-size"), ("--ep", "--expert-model-parallel-size")):
        assert f"[{short} {short[2:].upper()}]" in usage, usage
        assert f"{short} {short[2:].upper()}, {long} {short[2:].upper()}" in text  # Megatron's name stays listed


def test_pp_mismatch_names_both_sizes_and_the_reshard_command(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", tp=1, pp=4)
    code, out = run(capsys, "--world-size", 8, "--load", ckpt)
    assert code == 1
    assert "this checkpoint was saved with PP=4 but you are launching PP=1" in out
    expected = (f"ascend-patch convert --load-model-type mg --save-model-type mg --load-dir {ckpt} "
                f"--save-dir {ckpt}_tp1_pp1 --target-tensor-parallel-size 1 --target-pipeline-parallel-size 1")
    assert expected in out
    assert f"then launch with --load {ckpt}_tp1_pp1" in out
    assert "saved TP=1 PP=4 EP=1" in out
    assert convert_command(str(ckpt), 1, 1) == expected


def test_tp_and_pp_both_differ(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", tp=2, pp=2)
    code, out = run(capsys, "--world-size", 8, "--tp", 4, "--pp", 1, "--load", ckpt)
    assert code == 1
    assert "saved with TP=2 and PP=2 but you are launching TP=4 and PP=1" in out
    assert "--target-tensor-parallel-size 4 --target-pipeline-parallel-size 1" in out


def test_matching_launch_prints_the_rank_table_and_passes(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", tp=2, pp=2)
    code, out = run(capsys, "--nnodes", 2, "--nproc-per-node", 4, "--tensor-model-parallel-size", 2,
                    "--pipeline-model-parallel-size", 2, "--load", ckpt, "--hf-config", hf_config(tmp_path))
    assert code == 0, out
    assert "8 ranks (2 nodes x 4): TP=2 x CP=1 x DP=2 x PP=2" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:8] == ["rank", "node", "local", "tp", "cp",
                                                                           "ep", "dp", "pp"])
    assert lines[header + 2 + 5].split() == ["5", "1", "1", "1", "0", "0", "0", "1"]  # rank 5: node 1, pp 1
    assert "PP groups (4 x 2): [0, 4] [1, 5] [2, 6] [3, 7]" in out
    assert out.rstrip().endswith("OK: no errors")


def test_model_errors_from_an_hf_config(tmp_path, capsys):
    config = hf_config(tmp_path, layers=28, heads=4, kv=2, ffn=128)
    code, out = run(capsys, "--world-size", 24, "--tp", 3, "--pp", 8, "--hf-config", config)
    assert code == 1
    assert "4 attention heads cannot be split over 3 tensor-parallel ranks; use --tensor-model-parallel-size " \
           "1, 2 or 4" in out
    assert "2 query groups (KV heads) do not fit 3 tensor-parallel ranks" in out
    assert "FFN hidden size 128 cannot be split over 3 tensor-parallel ranks" in out
    assert "28 layers cannot be split over 8 pipeline stages; use --pipeline-model-parallel-size 1, 2, 4, 7, 14 " \
           "or 28, or split unevenly: --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 " \
           "gives 2,4,4,4,4,4,4,2" in out
    code, out = run(capsys, "--world-size", 16, "--tp", 2, "--pp", 8, "--hf-config", config,
                    "--num-layer-list", "4,4,4,4,3,3,3,3")
    assert code == 0, out


def test_checkpoint_and_config_of_different_models(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", args={"num_layers": 8})
    code, out = run(capsys, "--world-size", 1, "--load", ckpt, "--hf-config", hf_config(tmp_path, layers=6))
    assert code == 1
    assert "the checkpoint was saved with num_layers=8 but qwen2 from" in out and "says 6" in out


def test_world_errors(capsys):
    code, out = run(capsys, "--world-size", 6, "--tp", 2, "--pp", 2)
    assert code == 1 and "world size 6 is not divisible by TP x PP x CP = 2 x 2 x 1 = 4" in out
    code, out = run(capsys, "--world-size", 6, "--nnodes", 2, "--nproc-per-node", 4)
    assert code == 1 and "--world-size 6 disagrees with --nnodes 2 x --nproc-per-node 4 = 8" in out
    code, out = run(capsys, "--tp", 2)
    assert code == 1 and "give --world-size, or --nnodes and --nproc-per-node" in out
    code, out = run(capsys, "--world-size", 16, "--cp", 2, "--seq-length", 4095)
    assert code == 1 and "sequence length 4095 cannot be split into 2 x CP = 4 chunks (CP=2)" in out


def test_tp_spanning_nodes_is_a_warning(capsys):
    code, out = run(capsys, "--nnodes", 2, "--nproc-per-node", 4, "--tp", 8)
    assert code == 0
    assert "TP group [0, 1, 2, 3, 4, 5, 6, 7] spans nodes 0, 1" in out


def test_incomplete_checkpoint(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", pp=4, skip=("mp_rank_00_002",))
    code, out = run(capsys, "--world-size", 4, "--pp", 4, "--load", ckpt)
    assert code == 1
    assert "is incomplete: TP=1 x PP=4 x EP=1 needs 4 rank folders, mp_rank_00_002 missing" in out


def test_two_part_folder_names_read_with_the_saved_args(tmp_path):
    ep_ckpt = make_checkpoint(tmp_path / "ep", tp=1, pp=1, ep=2)  # mp_rank_00_000, mp_rank_00_001 = EP
    layout = probe_checkpoint(str(ep_ckpt))
    assert (layout.format, layout.tp, layout.pp, layout.ep, layout.iteration) == ("torch", 1, 1, 2, 100)
    bare = make_checkpoint(tmp_path / "bare", pp=2, with_args=False)
    layout = probe_checkpoint(str(bare))
    assert (layout.pp, layout.ep) == (2, 1)
    assert any("read as TP x PP" in n for n in layout.notes)
    assert any("holds no 'args'" in n for n in layout.notes)


def test_layer_placement_mismatch_at_equal_pp(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", pp=2)
    code, out = run(capsys, "--world-size", 2, "--pp", 2, "--load", ckpt, "--num-layer-list", "5,3")
    assert code == 1
    assert "places layers 4,4 on its 2 pipeline stages but the launch places 5,3" in out
    assert "--num-layer-list 5,3" in out


def test_distributed_checkpoint_reshards_on_load(tmp_path):
    iteration = tmp_path / "dist" / "iter_0000010"
    iteration.mkdir(parents=True)
    (tmp_path / "dist" / "latest_checkpointed_iteration.txt").write_text("10")
    import torch.distributed.checkpoint as dcp

    dcp.save({"embedding.word_embeddings.weight": torch.zeros(4, 2)}, checkpoint_id=str(iteration), no_dist=True)
    torch.save({"args": argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                                           num_layers=8)}, iteration / "common.pt")
    report = preflight(world_size=8, tp=1, pp=1, load=str(tmp_path / "dist"))
    assert report.errors == []
    assert report.checkpoint.format == "torch_dist" and (report.checkpoint.tp, report.checkpoint.pp) == (2, 4)
    assert any("re-shards it on load" in n for n in report.notes)


def test_broken_tracker_and_missing_directory(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "latest_checkpointed_iteration.txt").write_text("50")
    report = preflight(world_size=1, load=str(tmp_path / "c"))
    assert any("points at iter_0000050/, which does not exist" in str(e) for e in report.errors)
    report = preflight(world_size=1, load=str(tmp_path / "nowhere"))
    assert any("no such directory" in str(e) for e in report.errors)


def test_json_output(capsys):
    code, out = run(capsys, "--world-size", 8, "--tp", 2, "--ep", 2, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["layout"] == {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 2, "expert_tp": 2, "expert_dp": 2,
                              "order": "tp-cp-ep-dp-pp"}
    assert data["ranks"][3] == {"rank": 3, "node": 0, "local_rank": 3, "tp": 1, "cp": 0, "ep": 1, "dp": 1,
                                "pp": 0, "expert_tp": 1, "expert_dp": 0}
    assert data["groups"]["expert_model_parallel"][:2] == [[0, 2], [1, 3]]


def test_unmapped_nccl_variables_are_warned_about(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    code, out = run(capsys, "--world-size", 1)
    assert code == 0
    assert "NCCL_IB_HCA has no HCCL counterpart; it has no effect on the npu target" in out


@pytest.mark.parametrize("argv", [["--help"]])
def test_help_lists_the_command(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", *argv])
    assert info.value.code == 0
    assert "--nproc-per-node" in capsys.readouterr().out


def test_mismatch_says_which_folders_each_side_has(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "ckpt", tp=2, pp=4)
    code, out = run(capsys, "--world-size", 8, "--tp", 2, "--pp", 1, "--load", ckpt)
    assert code == 1
    assert ("rank 0 would look for mp_rank_00/ and 1 more, which the checkpoint does not have (it has "
            "mp_rank_00_000/ .. mp_rank_01_003/)") in out


def test_mismatch_between_two_pipelined_layouts_says_what_differs(tmp_path, capsys):
    # both sides PP > 1: the folders the launch reads exist, but hold other layers
    ckpt = make_checkpoint(tmp_path / "ckpt", tp=2, pp=4)
    code, out = run(capsys, "--world-size", 4, "--tp", 2, "--pp", 2, "--load", ckpt)
    assert code == 1
    assert ("saved with PP=4 but you are launching PP=2: the torch format cannot be re-sharded on load (the "
            "folders the launch reads exist (mp_rank_00_000/ .. mp_rank_01_001/), but mp_rank_00_000/ holds "
            "layers 0-1 (PP=4) where stage 0 at PP=2 needs layers 0-3; 4 of its 8 folders would not be read). "
            "Re-shard it first:") in out
    assert "rank 0 would look for" not in out
    ckpt = make_checkpoint(tmp_path / "ckpt4", tp=4, pp=2)
    code, out = run(capsys, "--world-size", 4, "--tp", 2, "--pp", 2, "--load", ckpt)
    assert ("(the folders the launch reads exist (mp_rank_00_000/ .. mp_rank_01_001/), but each file holds 1/4 of "
            "every tensor-parallel weight (TP=4) where a rank at TP=2 needs 1/2; 4 of its 8 folders would not be "
            "read)") in out


def test_expert_parallel_mismatch_prints_the_converter_command_with_the_ep_size(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "moe", ep=2, args={"num_experts": 4})
    code, out = run(capsys, "--world-size", 2, "--load", ckpt)
    assert code == 1
    assert ("this checkpoint was saved with EP=2 but you are launching EP=1: the torch format cannot be re-sharded "
            "on load (rank 0 would look for mp_rank_00/, which the checkpoint does not have (it has "
            "mp_rank_00_000/ .. mp_rank_00_001/)).") in out
    assert (f"ascend-patch convert --load-model-type mg --save-model-type mg --load-dir {ckpt} --save-dir "
            f"{ckpt}_tp1_pp1_ep1 --target-tensor-parallel-size 1 --target-pipeline-parallel-size 1 "
            f"--target-expert-parallel-size 1") in out
    # TP differing on an expert-parallel checkpoint: the command re-shards TP and keeps the launch's EP
    ckpt = make_checkpoint(tmp_path / "moe2", tp=2, ep=2, args={"num_experts": 4})
    code, out = run(capsys, "--world-size", 4, "--ep", 2, "--load", ckpt)
    assert code == 1 and "saved with TP=2 but you are launching TP=1" in out
    assert "--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1 --target-expert-parallel-size 2" in out
    code, out = run(capsys, "--world-size", 4, "--tp", 2, "--ep", 2, "--load", ckpt)
    assert code == 0, out
    # expert-TP other than TP: the legacy layout cannot hold it, so no converter command
    ckpt = make_checkpoint(tmp_path / "moe3", ep=2, args={"num_experts": 4})
    code, out = run(capsys, "--world-size", 4, "--tp", 2, "--ep", 2, "--expert-tensor-parallel-size", 1,
                    "--load", ckpt)
    assert code == 1 and "--load-model-type" not in out
    assert ("ascend-patch convert writes expert-parallel (MoE) checkpoints only with expert-TP = TP (the legacy "
            "layout names files by TP rank), and the launch has expert-TP 1 with TP 2. Launch with the saved sizes "
            "(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 2)") in out


def test_virtual_pipeline_mismatch_both_ways(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "vpp", pp=2, vpp=2)
    layout = probe_checkpoint(str(ckpt))
    assert (layout.tp, layout.pp, layout.ep, layout.vpp) == (1, 2, 1, 2)
    code, out = run(capsys, "--world-size", 2, "--pp", 2, "--load", ckpt)
    assert code == 1
    assert ("this checkpoint was saved with VPP=2 but you are launching VPP=1: the torch format cannot be "
            "re-sharded on load (the folders the launch reads exist (mp_rank_00_000/ .. mp_rank_00_001/), but each "
            "file holds model0, model1 (VPP=2) where the launch builds one model chunk and reads 'model')") in out
    assert (f"--save-dir {ckpt}_tp1_pp2 --target-tensor-parallel-size 1 --target-pipeline-parallel-size 2 "
            f"--virtual-pipeline-parallel-size 1\n") in out
    assert "saved TP=1 PP=2 EP=1 VPP=2" in out
    assert run(capsys, "--world-size", 2, "--pp", 2, "--num-virtual-stages-per-pipeline-rank", 2,
               "--load", ckpt)[0] == 0
    plain = make_checkpoint(tmp_path / "plain", pp=2)
    code, out = run(capsys, "--world-size", 2, "--pp", 2, "--num-virtual-stages-per-pipeline-rank", 2,
                    "--load", plain)
    assert code == 1 and "saved with VPP=1 but you are launching VPP=2" in out
    assert "where the launch builds 2 chunks per rank and reads model0, model1" in out
    assert (f"--virtual-pipeline-parallel-size 2\n    then launch with --load {plain}_tp1_pp2_vpp2") in out
    assert convert_command("/c", 2, 4, 2) == (
        "ascend-patch convert --load-model-type mg --save-model-type mg --load-dir /c --save-dir /c_tp2_pp4_vpp2 "
        "--target-tensor-parallel-size 2 --target-pipeline-parallel-size 4 --virtual-pipeline-parallel-size 2")


def test_args_with_megatron_enums_are_read_without_megatron(tmp_path, capsys):
    # Megatron-LM's args hold enum members (attention_backend=AttnBackend.auto): the probe reads them
    # with the converter's safe reader; before, it fell back to folder names and read EP=2 as PP=2
    ckpt = make_checkpoint(tmp_path / "ep", ep=2, args={"num_experts": 4}, megatron_enum=True)
    rank_file = ckpt / "iter_0000100" / "mp_rank_00_000" / "model_optim_rng.pt"
    with pytest.raises(ModuleNotFoundError, match="megatron.training"):
        torch.load(rank_file, weights_only=False)  # the pickle needs the class, which is not here
    layout = probe_checkpoint(str(ckpt))
    assert (layout.tp, layout.pp, layout.ep, layout.vpp) == (1, 1, 2, 1)
    assert layout.args["expert_model_parallel_size"] == 2 and layout.args["num_experts"] == 4
    assert layout.notes == [] and layout.problems == []
    assert ENUM_MODULE not in sys.modules
    code, out = run(capsys, "--world-size", 2, "--ep", 2, "--load", ckpt)
    assert code == 0, out


def test_a_pickle_needing_other_code_is_not_run(tmp_path):
    ckpt = make_checkpoint(tmp_path / "odd", args={"when": datetime.date(2024, 1, 2)})
    layout = probe_checkpoint(str(ckpt))
    assert layout.args == {} and (layout.pp, layout.ep) == (1, 1)
    rank_file = f"{ckpt}/iter_0000100/mp_rank_00/model_optim_rng.pt"
    assert [str(p) for p in layout.problems] == [(
        f"{rank_file} cannot be read safely: unpickling it needs datetime.date, which is neither a plain container, "
        "a tensor nor a Megatron class, so its args and layout were not checked (nothing from the file was "
        "executed); do not load it (Megatron's torch.load(weights_only=False) would run that code); take the "
        "checkpoint from a source you trust, or re-save its tensors and args where it was written")]
    trusted = probe_checkpoint(str(ckpt), trust=True)  # the user's explicit choice; no message suggests it
    assert trusted.args["num_layers"] == 8 and trusted.notes == [] and trusted.problems == []


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_rank_file_is_an_error_and_the_clean_copy_still_shows_its_real_error(tmp_path, capsys):
    # issue 13 item 9: the hostile copy said "OK: no errors" and advised --trust-checkpoint
    config = hf_config(tmp_path, layers=28)
    clean = make_checkpoint(tmp_path / "clean", args={"num_layers": 24})
    hostile = make_checkpoint(tmp_path / "hostile", args={"num_layers": 24})
    marker = tmp_path / "pwned"
    rank_file = hostile / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    state = torch.load(rank_file, weights_only=False)
    state["extra"] = _RunsCode(str(marker))
    torch.save(state, rank_file)
    code, out = run(capsys, "--world-size", 1, "--hf-config", config, "--load", clean)
    assert code == 1
    assert f"the checkpoint was saved with num_layers=24 but qwen2 from {config} says 28" in out
    code, out = run(capsys, "--world-size", 1, "--hf-config", config, "--load", hostile)
    assert code == 1 and "OK: no errors" not in out and "1 error(s)" in out
    assert f"{rank_file} cannot be read safely: unpickling it needs posix.system" in out
    assert "--trust-checkpoint" not in out and "weights_only=False) would run that code" in out
    assert not marker.exists()


def test_first_and_last_stage_flags_describe_an_uneven_launch(tmp_path, capsys):
    config = hf_config(tmp_path, layers=28)
    code, out = run(capsys, "--world-size", 8, "--pp", 8, "--hf-config", config,
                    "--decoder-first-pipeline-num-layers", 2, "--decoder-last-pipeline-num-layers", 2)
    assert code == 0, out
    assert ("layers per pipeline stage 2,4,4,4,4,4,4,2: megatron-core builds them with "
            "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2") in out
    code, out = run(capsys, "--world-size", 8, "--pp", 8, "--hf-config", config, "--num-layer-list",
                    "4,4,4,4,3,3,3,3")
    assert code == 0 and "--pipeline-model-parallel-layout 'Et*4|t*4|t*4|t*4|t*3|t*3|t*3|t*3L'" in out
    code, out = run(capsys, "--world-size", 8, "--pp", 8, "--hf-config", config,
                    "--decoder-first-pipeline-num-layers", 3, "--decoder-last-pipeline-num-layers", 2)
    assert code == 1
    assert ("--decoder-first-pipeline-num-layers 3 and --decoder-last-pipeline-num-layers 2 leave 23 of the 28 "
            "layers for 6 middle pipeline stage(s) (PP=8): megatron-core needs them to divide evenly, at least 1 "
            "each; e.g. --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 gives "
            "2,4,4,4,4,4,4,2") in out


def test_saved_first_and_last_stage_args_give_the_saved_placement(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "uneven", pp=4, args={"num_layers": 12, "decoder_first_pipeline_num_layers": 2,
                                                            "decoder_last_pipeline_num_layers": 4})
    code, out = run(capsys, "--world-size", 4, "--pp", 4, "--load", ckpt)
    assert code == 1
    assert "this checkpoint places layers 2,3,3,4 on its 4 pipeline stages but the launch places 3,3,3,3" in out
    assert f"--save-dir {ckpt}_tp1_pp4 --target-tensor-parallel-size 1 --target-pipeline-parallel-size 4\n" in out
    code, out = run(capsys, "--world-size", 4, "--pp", 4, "--load", ckpt,
                    "--decoder-first-pipeline-num-layers", 2, "--decoder-last-pipeline-num-layers", 4)
    assert code == 0, out


QWEN3_1_7B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048,
              "intermediate_size": 6144, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 28, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "max_position_embeddings": 40960,
              "hidden_act": "silu"}


def test_arguments_that_disagree_with_the_hf_config_are_errors(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1_7B))
    argv = ("--num-layers 28 --hidden-size 2048 --num-attention-heads 16 --kv-channels 64 --swiglu "
            "--disable-bias-linear --group-query-attention --num-query-groups 8 --qk-layernorm")
    code = main(["check", "--world-size", "4", "--tp", "2", "--pp", "2", "--hf-config", str(tmp_path),
                 "--num-attention-heads", "32", "--megatron-args", argv])
    out = capsys.readouterr().out
    assert code == 1
    assert f"--num-attention-heads 32 disagrees with {tmp_path}, which says 16" in out
    assert "--kv-channels 64: config.json says 128" in out
    assert "2 error(s)" in out
    right = argv.replace("--kv-channels 64", "--kv-channels 128")
    assert main(["check", "--world-size", "4", "--tp", "2", "--pp", "2", "--hf-config", str(tmp_path),
                 "--megatron-args", right]) == 0
    assert "OK: no errors" in capsys.readouterr().out


def test_tp_errors_come_with_the_sizes_that_fit_everything(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1_7B))
    assert main(["check", "--world-size", "8", "--tp", "3", "--hf-config", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "TP sizes that fit the heads, query groups, FFN and 8 ranks (PP=1, CP=1) together: 1, 2, 4 or 8" in out


def test_megatron_args_with_the_two_word_spec_and_multi_valued_flags(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1_7B))
    argv = ("--num-layers 28 --hidden-size 2048 --num-attention-heads 16 --kv-channels 128 --swiglu "
            "--disable-bias-linear --group-query-attention --num-query-groups 8 --qk-layernorm --bf16 "
            "--spec some.module layer_spec --data-path 0.5 /data/a 0.5 /data/b")
    code = main(["check", "--world-size", "4", "--tp", "2", "--hf-config", str(tmp_path), "--megatron-args", argv])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.rstrip().endswith("OK: no errors")
    code = main(["check", "--world-size", "4", "--tp", "2", "--hf-config", str(tmp_path), "--megatron-args",
                 argv.replace("--bf16", "--fp16").replace("--spec some.module layer_spec", "--spec qwen2")])
    out = capsys.readouterr().out
    assert code == 1
    assert f"--fp16: config.json says the model is bfloat16 (torch_dtype/dtype); use --bf16 ({tmp_path})" in out
    assert f"--spec qwen2: config.json describes a qwen3 model; use --spec qwen3 ({tmp_path})" in out
    assert "2 error(s)" in out


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing"])
def test_every_rank_file_is_checked_and_a_corrupt_one_is_named(tmp_path, capsys, damage):
    # issue 13 item 10: only rank 0's file was read, so a broken mp_rank_01 passed as "OK: no errors"
    ckpt = make_checkpoint(tmp_path / damage, tp=2, pp=2)
    assert run(capsys, "--world-size", 4, "--tp", 2, "--pp", 2, "--load", ckpt)[0] == 0
    bad = ckpt / "iter_0000100" / "mp_rank_01_001" / "model_optim_rng.pt"
    data = bad.read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[: len(data) - 100])
    elif damage == "garbage":
        bad.write_bytes(bytes(range(256)) * (len(data) // 256))
    else:
        bad.unlink()
    code, out = run(capsys, "--world-size", 4, "--tp", 2, "--pp", 2, "--load", ckpt)
    assert code == 1 and "1 error(s)" in out
    expected = {
        "truncated": f"{bad} ({len(data) - 100} bytes): the zip directory cannot be read (File is not a zip file); "
                     "the file is truncated or damaged; copy this file again",
        "garbage": f"{bad} ({len(data) // 256 * 256} bytes) is not a torch checkpoint: it is neither a zip archive "
                   "(torch >= 1.6) nor a legacy torch pickle",
        "missing": f"{bad} does not exist: this rank's weights are missing; copy the whole checkpoint again",
    }[damage]
    assert expected in out


def test_a_record_cut_short_inside_the_archive_is_named(tmp_path, capsys):
    ckpt = make_checkpoint(tmp_path / "c", tp=2)
    bad = ckpt / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt"
    import zipfile

    with zipfile.ZipFile(bad) as zf:
        info = zf.getinfo("model_optim_rng/byteorder")
    data = bytearray(bad.read_bytes())
    data[info.header_offset: info.header_offset + 4] = b"XXXX"  # the local header's signature
    bad.write_bytes(bytes(data))
    code, out = run(capsys, "--world-size", 2, "--tp", 2, "--load", ckpt)
    assert code == 1
    assert f"{bad}: record model_optim_rng/byteorder has no local header at byte {info.header_offset}" in out


def test_a_tensor_outside_its_record_is_named_in_rank_0_too(tmp_path, capsys):
    import struct
    import zipfile

    ckpt = make_checkpoint(tmp_path / "c")
    bad = ckpt / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    data = bytearray(bad.read_bytes())
    with zipfile.ZipFile(bad) as zf:
        start = zf.start_dir
    name = b"model_optim_rng/data/0"
    entry = data.index(name, start) - 46  # its central directory entry: sizes at +20 and +24
    assert struct.unpack_from("<II", data, entry + 20) == (8, 8)  # two float32 zeros
    struct.pack_into("<II", data, entry + 20, 4, 4)
    bad.write_bytes(bytes(data))
    code, out = run(capsys, "--world-size", 1, "--load", ckpt)
    assert code == 1
    assert f"{bad}: tensor 'w' (float32[2]) needs bytes" in out and "which no data record of the archive holds" in out
