"""torch_dist read and write, model-free: round trips, torch's own reader and writer, and the refusals.

The independent checks here are torch's: ``torch.distributed.checkpoint`` itself loads what the
saver writes (into the global tensors megatron-core would ask for), and writes a checkpoint
(whole stacked tensors, one chunk each: not how Megatron cuts them) that the loader reads. The
tensors are compared with the legacy TP 1 output of the same model, which the mg tests check
against megatron-core. Megatron-LM's own torch_dist checkpoints are in
tests/megatron_lm/test_torch_dist_qwen3.py.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch

from ascend_patch.loaders.blocks import CorruptCheckpoint
from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from ascend_patch.loaders.preflight import PreflightError
from ascend_patch.loaders.verify import detect_loader, verify
from helpers import child_env
from loaders_tiny import hf_state


def _legacy_tp1(path):
    """decoder.layers.{l}.X / embedding... -> tensor of a TP 1 PP 1 legacy checkpoint (TE key naming)."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(os.path.join(path, "iter_0000001", "mp_rank_00", "model_optim_rng.pt"), weights_only=True)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def _dcp_load(iter_dir, shapes):
    """torch.distributed.checkpoint's own loader, no process group: global tensors of the given shapes."""
    import torch.distributed.checkpoint as dcp

    state = {k: torch.empty(shape) for k, shape in shapes.items()}
    dcp.load(state, checkpoint_id=iter_dir, no_dist=True)
    return state


@pytest.fixture(scope="module")
def qwen3_dist(hf_checkpoint, tmp_path_factory):
    hf, _ = hf_checkpoint("qwen3")
    root = tmp_path_factory.mktemp("dist")
    result = convert(hf, str(root / "dist"), "hf", "torch_dist", ConvertOptions(verify=True))
    convert(hf, str(root / "legacy"), "hf", "mg", ConvertOptions(naming="te"))
    return hf, root, result


def test_hf_to_torch_dist_is_what_torch_reads_as_the_stacked_tp1_model(qwen3_dist):
    hf, root, result = qwen3_dist
    assert result.verify.ok and result.verify.key_sets_checked == 1, result.verify.summary()
    legacy = _legacy_tp1(str(root / "legacy"))
    layers = 1 + max(int(k.split(".")[2]) for k in legacy if k.startswith("decoder.layers."))
    shapes = {}
    for key, value in legacy.items():
        if key.startswith("decoder.layers."):
            shapes["decoder.layers." + key.split(".", 3)[3]] = (layers, *value.shape)
        else:
            shapes[key] = tuple(value.shape)
    loaded = _dcp_load(str(root / "dist" / "iter_0000001"), shapes)
    assert len(loaded) == len(shapes) == 10  # embedding, 8 stacked layer tensors, final norm (tied: no output)
    for key, value in legacy.items():
        if key.startswith("decoder.layers."):
            layer, rest = key.split(".")[2], key.split(".", 3)[3]
            assert torch.equal(loaded["decoder.layers." + rest][int(layer)], value), key
        else:
            assert torch.equal(loaded[key], value), key
    names = sorted(os.listdir(root / "dist" / "iter_0000001"))
    assert names == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    assert (root / "dist" / "latest_checkpointed_iteration.txt").read_text() == "1"


def test_megatron_reads_the_model_from_common_pt(qwen3_dist):
    _, root, _ = qwen3_dist
    with torch.serialization.safe_globals([argparse.Namespace]):
        common = torch.load(str(root / "dist" / "iter_0000001" / "common.pt"), weights_only=True)
    args = common["args"]
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 1)
    assert (args.ckpt_format, args.no_save_optim, args.no_save_rng) == ("torch_dist", True, True)
    assert args.padded_vocab_size == 384 and args.num_layers == 4 and args.qk_layernorm


def test_torch_dist_round_trips_bit_exact(qwen3_dist, tmp_path):
    hf, root, _ = qwen3_dist
    back = convert(str(root / "dist"), str(tmp_path / "hf"), "mg", "hf", ConvertOptions(verify=True))
    assert back.source.format == "torch_dist"  # --load-model-type mg recognised it
    assert back.verify.ok, back.verify.summary()
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    # torch_dist -> legacy TP2 PP2 -> torch_dist: the same bytes in every tensor record
    convert(str(root / "dist"), str(tmp_path / "mg"), "torch_dist", "mg", ConvertOptions(target_tp=2, target_pp=2))
    assert (tmp_path / "mg" / "latest_checkpointed_iteration.txt").read_text() == "1"  # the source's iteration
    again = convert(str(tmp_path / "mg"), str(tmp_path / "dist2"), "mg", "torch_dist", ConvertOptions(verify=True))
    assert again.verify.ok, again.verify.summary()
    report = verify(str(tmp_path / "dist2"), str(root / "dist"))
    assert report.ok and report.tensors_checked == 8 * 4 + 2, report.summary()  # one per layer and tensor
    a = (root / "dist" / "iter_0000001" / "__0_0.distcp").read_bytes()
    b = (tmp_path / "dist2" / "iter_0000001" / "__0_0.distcp").read_bytes()
    assert a == b


def test_a_checkpoint_torch_itself_wrote_with_whole_stacked_chunks(qwen3_dist, tmp_path):
    """dcp.save of the global tensors: one chunk per key holding every layer (Megatron writes one per layer)."""
    import torch.distributed.checkpoint as dcp

    hf, root, _ = qwen3_dist
    legacy = _legacy_tp1(str(root / "legacy"))
    stacked: dict[str, list] = {}
    state = {}
    for key, value in legacy.items():
        if key.startswith("decoder.layers."):
            stacked.setdefault("decoder.layers." + key.split(".", 3)[3], []).append((int(key.split(".")[2]), value))
        else:
            state[key] = value
    for key, parts in stacked.items():
        state[key] = torch.stack([v for _, v in sorted(parts, key=lambda p: p[0])])
    iter_dir = tmp_path / "ckpt" / "iter_0000007"
    dcp.save(state, checkpoint_id=str(iter_dir), no_dist=True)
    (iter_dir / "common.pt").write_bytes((root / "dist" / "iter_0000001" / "common.pt").read_bytes())
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7")
    assert detect_loader(str(tmp_path / "ckpt")) in ("mg", "torch_dist")
    out = convert(str(tmp_path / "ckpt"), str(tmp_path / "hf"), "mg", "hf", ConvertOptions(verify=True))
    assert out.verify.ok and out.source.iteration == 7
    convert(str(tmp_path / "ckpt"), str(tmp_path / "mg"), "mg", "mg", ConvertOptions())
    assert (tmp_path / "mg" / "iter_0000007").is_dir()  # Megatron -> Megatron keeps the iteration, either format
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    # it holds every tensor but none of the per-layer extra-state objects megatron-core also asks for
    report = verify(str(tmp_path / "ckpt"))
    assert [p.code for p in report.problems] == ["keys-missing"], report.summary()
    assert "lacks 16 key(s)" in report.problems[0].message  # 4 layers x 4 linear layers (local spec)
    assert "decoder.layers.mlp.linear_fc1._extra_state/shard_0_4" in report.problems[0].message


def test_missing_and_foreign_tensors_are_refused_with_the_keys(qwen3_dist, tmp_path):
    import torch.distributed.checkpoint as dcp

    _, root, _ = qwen3_dist
    shapes = {"embedding.word_embeddings.weight": (384, 64), "decoder.final_layernorm.weight": (64,)}
    state = _dcp_load(str(root / "dist" / "iter_0000001"), shapes)
    state["decoder.layers.mlp.experts.linear_fc1.weight"] = torch.zeros(2, 8, 4)
    iter_dir = tmp_path / "iter_0000001"
    dcp.save(state, checkpoint_id=str(iter_dir), no_dist=True)
    (iter_dir / "common.pt").write_bytes((root / "dist" / "iter_0000001" / "common.pt").read_bytes())
    with pytest.raises(PreflightError) as err:
        convert(str(iter_dir), str(tmp_path / "hf"), "torch_dist", "hf")
    text = str(err.value)
    assert "lacks 8 tensor(s)" in text and "2 problems" in text and "decoder.layers.self_attention.linear_qkv.weight" in text
    assert "decoder.layers.mlp.experts.linear_fc1.weight" in text and "pass its MoE family" in text


def test_metadata_naming_other_globals_is_not_unpickled(qwen3_dist, tmp_path):
    from ascend_patch.loaders.torch_dist_io import read_dist_metadata

    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(os.system))
    with pytest.raises(CorruptCheckpoint, match=r"names posix\.system, .*nothing from the file was executed"):
        read_dist_metadata(str(path))
    path.write_bytes((qwen3_dist[1] / "dist" / "iter_0000001" / ".metadata").read_bytes()[:100])
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        read_dist_metadata(str(path))


def test_cli_ckpt_format_chooses_the_megatron_output(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("qwen3")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ascend_patch.cli", "convert", "--load-dir", hf, *args],
                              env=child_env(ASCEND_PATCH="0"), capture_output=True, text=True, timeout=300)

    done = cli("--save-model-type", "mg", "--ckpt-format", "torch_dist", "--target-tensor-parallel-size", "2",
               "--save-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "torch_dist" in done.stdout and "padded vocabulary 512 (TP 2)" in done.stdout
    assert os.path.isfile(tmp_path / "out" / "iter_0000001" / ".metadata")
    refused = cli("--save-model-type", "hf", "--ckpt-format", "torch_dist", "--save-dir", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--ckpt-format torch_dist chooses a Megatron output format" in refused.stderr


def test_the_metadata_is_what_torchs_own_types_build(tmp_path):
    """The saver pickles constructor calls of torch.distributed.checkpoint's types without importing torch."""
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)

    from ascend_patch.loaders.torch_dist_io import DCP_VERSION, EXTRA_STATE_BYTES, DistItem, dumps_metadata
    from ascend_patch.loaders.torch_zip import Slot

    items = [DistItem("w", slot=Slot(f"w[{i}]", (1, 4, 2), "bfloat16"), global_shape=(2, 4, 2), offsets=(i, 0, 0))
             for i in range(2)] + [DistItem("m._extra_state/shard_0_2", data=EXTRA_STATE_BYTES)]
    got = pickle.loads(dumps_metadata([("__0_0.distcp", items)], {"w": "bfloat16"}))
    first = got.storage_data[MetadataIndex("w", torch.Size([0, 0, 0]))].length  # both archives are this long
    assert first > 4 * 2 * 2
    want = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([2, 4, 2]),
                                       [ChunkStorageMetadata(torch.Size([i, 0, 0]), torch.Size([1, 4, 2]))
                                        for i in range(2)]),
            "m._extra_state/shard_0_2": BytesStorageMetadata()},
        storage_data={MetadataIndex("w", torch.Size([0, 0, 0])): _StorageInfo("__0_0.distcp", 0, first),
                      MetadataIndex("w", torch.Size([1, 0, 0])): _StorageInfo("__0_0.distcp", first, first),
                      MetadataIndex("m._extra_state/shard_0_2"): _StorageInfo("__0_0.distcp", 2 * first,
                                                                             len(EXTRA_STATE_BYTES))},
        version=CURRENT_DCP_VERSION)
    assert got == want and DCP_VERSION == CURRENT_DCP_VERSION
    assert torch.load(__import__("io").BytesIO(EXTRA_STATE_BYTES), weights_only=True) == [None]


def test_writing_torch_dist_does_not_import_torch(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("qwen3")
    code = ("import sys; from ascend_patch.loaders.engine import convert; "
            f"convert({hf!r}, {str(tmp_path / 'out')!r}, 'hf', 'torch_dist'); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_untied_and_biased_families_round_trip(family, hf_checkpoint, tmp_path):
    """llama: an output layer of its own; qwen2: q/k/v biases, interleaved per group like the weights."""
    hf, _ = hf_checkpoint(family)
    out = convert(hf, str(tmp_path / "dist"), "hf", "torch_dist",
                  ConvertOptions(verify=True, target_tp=2, target_pp=2, naming="te"))
    assert out.verify.ok and out.verify.key_sets_checked == 1, out.verify.summary()
    assert out.plan.notes == ["torch_dist is re-sharded on load: the pipeline layout flags have no effect on it "
                              "(choose PP / virtual stages / an uneven split when launching)"]
    held = read_keys(str(tmp_path / "dist" / "iter_0000001"))
    assert ("output_layer.weight" in held) and (("decoder.layers.self_attention.linear_qkv.bias" in held)
                                                == (family == "qwen2"))
    assert "decoder.layers.self_attention.core_attention._extra_state/shard_3_4" in held  # the TE spec's objects
    back = convert(str(tmp_path / "dist"), str(tmp_path / "hf"), "mg", "hf", ConvertOptions())
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert back.source.format == "torch_dist"
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)


def read_keys(iter_dir):
    from ascend_patch.loaders.torch_dist_io import read_dist_metadata

    return set(read_dist_metadata(os.path.join(iter_dir, ".metadata")).state_dict_metadata)


def _legacy_tp1_stacked(path):
    """The legacy TP 1 checkpoint's tensors stacked as megatron-core keys them in torch_dist: layers on axis 0,
    an expert's tensors (``...local_experts.{e}...``) on the expert axis 1, under the name SequentialMLP gives them
    (``experts.`` prepended to the module path ``mlp.experts``) — built from the legacy keys by hand."""
    cells: dict[str, dict[tuple[int, ...], torch.Tensor]] = {}
    state = {}
    for key, value in _legacy_tp1(path).items():
        parts = key.split(".")
        if key.startswith("decoder.layers.") and parts[3:6] == ["mlp", "experts", "local_experts"]:
            cells.setdefault(".".join(["decoder.layers.mlp.experts.experts", *parts[7:]]), {})[(int(parts[2]), int(parts[6]))] = value
        elif key.startswith("decoder.layers."):
            cells.setdefault("decoder.layers." + key.split(".", 3)[3], {})[(int(parts[2]),)] = value
        else:
            state[key] = value
    for key, by_cell in cells.items():
        grid = [1 + max(c[a] for c in by_cell) for a in range(len(next(iter(by_cell))))]
        assert len(by_cell) == math.prod(grid), key  # every (layer[, expert]) cell once
        first = next(iter(by_cell.values()))
        state[key] = torch.stack([by_cell[c] for c in sorted(by_cell)]).reshape(*grid, *first.shape)
    return state


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe_dist(request, hf_checkpoint, tmp_path_factory):
    hf, _ = hf_checkpoint(request.param)
    root = tmp_path_factory.mktemp(f"dist_{request.param}")
    result = convert(hf, str(root / "dist"), "hf", "torch_dist", ConvertOptions(verify=True, naming="te"))
    convert(hf, str(root / "legacy"), "hf", "mg", ConvertOptions(naming="te"))
    return request.param, hf, root, result


def test_moe_experts_lie_on_their_own_axis_as_torch_reads_them(moe_dist):
    """megatron-core's SequentialMLP / TEGroupedMLP layout: ``decoder.layers.mlp.experts.experts.linear_fc1.weight`` is
    [layers, experts, 2 x expert FFN, hidden] (gate over up), the router [layers, experts, hidden]."""
    family, _, root, result = moe_dist
    assert result.verify.ok and result.verify.key_sets_checked == 1, result.verify.summary()
    want = _legacy_tp1_stacked(str(root / "legacy"))
    experts = {"qwen3_moe": 8, "mixtral": 4}[family]
    ffn = {"qwen3_moe": 32, "mixtral": 48}[family]
    assert want["decoder.layers.mlp.experts.experts.linear_fc1.weight"].shape == (4, experts, 2 * ffn, 64)
    assert want["decoder.layers.mlp.experts.experts.linear_fc2.weight"].shape == (4, experts, 64, ffn)
    assert want["decoder.layers.mlp.router.weight"].shape == (4, experts, 64)
    loaded = _dcp_load(str(root / "dist" / "iter_0000001"), {k: v.shape for k, v in want.items()})
    assert all(torch.equal(loaded[k], want[k]) for k in want)
    held = read_keys(str(root / "dist" / "iter_0000001"))
    assert set(want) <= held
    # one extra-state object per layer and expert, keyed by megatron-core's offsets (layer.expert_layers.experts)
    assert f"decoder.layers.mlp.experts.experts.linear_fc2._extra_state/shard_3.{experts - 1}_4.{experts}" in held
    assert sum("experts.experts.linear_fc1._extra_state" in k for k in held) == 4 * experts
    # the pre-MLP norm (apart from fc1 in an MoE layer) also under the local spec's name for it, equal
    norm, local_name = "decoder.layers.pre_mlp_layernorm.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight"
    both = _dcp_load(str(root / "dist" / "iter_0000001"), {local_name: want[norm].shape})
    assert torch.equal(both[local_name], want[norm])


def test_moe_torch_dist_round_trips_through_hf_and_the_ep_layout(moe_dist, tmp_path):
    family, hf, root, _ = moe_dist
    back = convert(str(root / "dist"), str(tmp_path / "hf"), "mg", "hf", ConvertOptions(verify=True))
    assert back.source.format == "torch_dist" and back.source.spec.name == family
    assert back.verify.ok, back.verify.summary()
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    # torch_dist -> legacy TP2 x EP2 (mp_rank_TT_000_EEE) -> torch_dist: the same bytes
    convert(str(root / "dist"), str(tmp_path / "mg"), "torch_dist", "mg",
            ConvertOptions(target_tp=2, target_ep=2, naming="te"))
    assert sorted(os.listdir(tmp_path / "mg" / "iter_0000001")) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    again = convert(str(tmp_path / "mg"), str(tmp_path / "dist2"), "mg", "torch_dist",
                    ConvertOptions(verify=True, naming="te"))
    assert again.verify.ok, again.verify.summary()
    a = (root / "dist" / "iter_0000001" / "__0_0.distcp").read_bytes()
    b = (tmp_path / "dist2" / "iter_0000001" / "__0_0.distcp").read_bytes()
    assert a == b


def test_moe_torch_dist_written_by_torch_with_whole_chunks(moe_dist, tmp_path):
    """One chunk per key holding every layer and every expert: the reader cuts (layer, expert) cells out of it."""
    import torch.distributed.checkpoint as dcp

    _, hf, root, _ = moe_dist
    state = _legacy_tp1_stacked(str(root / "legacy"))
    iter_dir = tmp_path / "ckpt" / "iter_0000003"
    dcp.save(state, checkpoint_id=str(iter_dir), no_dist=True)
    (iter_dir / "common.pt").write_bytes((root / "dist" / "iter_0000001" / "common.pt").read_bytes())
    out = convert(str(iter_dir), str(tmp_path / "hf"), "torch_dist", "hf", ConvertOptions())
    assert out.source.iteration == 3
    want, got = hf_state(hf), hf_state(str(tmp_path / "hf"))
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)


def test_moe_torch_dist_takes_any_expert_tp_and_checks_the_expert_split(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("qwen3_moe")
    # expert-TP 1 under TP 2: the legacy layout cannot hold it, torch_dist has nothing per TP rank
    out = convert(hf, str(tmp_path / "dist"), "hf", "torch_dist",
                  ConvertOptions(target_tp=2, target_ep=4, target_etp=1))
    assert any("expert layout flags have no effect" in n for n in out.plan.notes)
    with pytest.raises(PreflightError) as err:  # 8 experts do not split over 3 EP ranks
        convert(hf, str(tmp_path / "bad"), "hf", "torch_dist", ConvertOptions(target_ep=3))
    assert "experts" in str(err.value) and "3" in str(err.value)
    assert not (tmp_path / "bad").exists()
