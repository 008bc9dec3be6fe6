"""File formats: safetensors and torch writers/readers, truncation, and pickles that try to run code."""

from __future__ import annotations

import argparse
import os
import zipfile

import pytest
import torch

from ascend_patch.loaders.blocks import BlockFiller, CorruptCheckpoint
from ascend_patch.loaders.safetensors_io import SafetensorsWriter, read_safetensors_index
from ascend_patch.loaders import torch_zip
from ascend_patch.loaders.blocks import raw_to_torch
from ascend_patch.loaders.torch_io import UnsafeCheckpoint, safe_load, tensor_infos
from ascend_patch.loaders.torch_zip import TORCH_DTYPES, Slot, TorchZipWriter


def _write_all(writer, tensors):
    for key, t in tensors.items():
        raw = t.contiguous().view(-1).view(torch.uint8)
        half = (raw.numel() // 2) // t.element_size() * t.element_size()
        writer.write(key, 0, memoryview(raw[:half].numpy()))  # two writes per tensor, in order
        writer.write(key, half, memoryview(raw[half:].numpy()))
    writer.close()


def test_safetensors_writer_is_read_by_safetensors(tmp_path):
    from safetensors.torch import load_file

    tensors = {"a": torch.randn(7, 5), "b": torch.randn(3).to(torch.bfloat16), "c": torch.arange(6).to(torch.int64)}
    path = str(tmp_path / "x.safetensors")
    w = SafetensorsWriter(path, [(k, tuple(t.shape), str(t.dtype).replace("torch.", "")) for k, t in tensors.items()])
    _write_all(w, tensors)
    back = load_file(path)
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    infos, meta = read_safetensors_index(path)
    assert meta == {"format": "pt"} and infos["a"].shape == (7, 5)
    assert torch.equal(raw_to_torch(BlockFiller(infos).read_rows("a", 2, 6), "float32"), tensors["a"][2:6])


def test_truncated_safetensors_names_the_file(tmp_path):
    from safetensors.torch import save_file

    path = str(tmp_path / "model.safetensors")
    save_file({"w": torch.randn(64, 64)}, path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) - 1000])
    with pytest.raises(CorruptCheckpoint, match="model.safetensors"):
        read_safetensors_index(path)
    with open(path, "wb") as f:
        f.write(b"\x00\x01")
    with pytest.raises(CorruptCheckpoint, match="model.safetensors"):
        read_safetensors_index(path)


@pytest.mark.parametrize("crc", [True, False])
@pytest.mark.parametrize("zip64", [False, True])
def test_torch_zip_writer_output_loads_with_torch(tmp_path, monkeypatch, crc, zip64):
    """Written without torch; read by torch.load (weights_only, plain and mmap) and by zipfile."""
    if zip64:  # exercise the >4 GiB records and offsets on a small file
        monkeypatch.setattr(torch_zip, "ZIP64_LIMIT", 600)
    tensors = {"model/w": torch.randn(33, 17), "model/b": torch.randn(5).to(torch.bfloat16)}
    skeleton = {"args": argparse.Namespace(num_layers=2, params_dtype=TORCH_DTYPES["bfloat16"]),
                "checkpoint_version": 3.0, "iteration": 1,
                "model": {"w": Slot("model/w", (33, 17), "float32"), "w._extra_state": None,
                          "b": Slot("model/b", (5,), "bfloat16")}}
    path = str(tmp_path / "model_optim_rng.pt")
    _write_all(TorchZipWriter(path, skeleton, crc=crc), tensors)
    for mmap in (False, True):
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, weights_only=True, mmap=mmap)
        assert state["args"].num_layers == 2 and state["args"].params_dtype is torch.bfloat16
        assert state["checkpoint_version"] == 3.0 and state["iteration"] == 1
        assert torch.equal(state["model"]["w"], tensors["model/w"])
        assert torch.equal(state["model"]["b"], tensors["model/b"])
        assert state["model"]["w._extra_state"] is None
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert names[0] == "archive/data.pkl" and "archive/version" in names
        if crc:
            assert zf.testzip() is None  # every CRC-32 is right
        if zip64:
            assert all(i.header_offset > 600 for i in zf.infolist()[-2:])
    infos = dict(tensor_infos(safe_load(path)["model"], path))
    got = BlockFiller({"w": infos["w"]}).read_rows("w", 10, 20)
    assert torch.equal(raw_to_torch(got, "float32"), tensors["model/w"][10:20])


@pytest.mark.parametrize("crc", [False, True])
def test_torch_zip_records_placed_at_their_source_page_offset(tmp_path, crc):
    """A record given its source's offset within a page starts at that offset within a page; torch reads it."""
    tensors = {"a": torch.randn(40, 8), "b": torch.randn(9).to(torch.bfloat16), "c": torch.randn(3, 3)}
    skeleton = {"model": {k: Slot(k, tuple(t.shape), str(t.dtype).replace("torch.", "")) for k, t in tensors.items()}}
    path = str(tmp_path / "model_optim_rng.pt")
    # a: 8-byte aligned in its source; b: 2-byte aligned (bf16); c: odd, not a float32 boundary -> default placement
    writer = TorchZipWriter(path, skeleton, crc=crc, page_offsets={"a": 4096 * 3 + 1000, "b": 2, "c": 7})
    assert writer.offsets["a"] % 4096 == 1000 and writer.offsets["b"] % 4096 == 2
    assert writer.offsets["c"] % 64 == 0 and writer.alignment == 2
    _write_all(writer, tensors)
    for mmap in (False, True):
        state = torch.load(path, weights_only=True, mmap=mmap)
        assert all(torch.equal(state["model"][k], t) for k, t in tensors.items())
    with zipfile.ZipFile(path) as zf:
        assert zf.read("archive/.storage_alignment") == b"02"
        if crc:
            assert zf.testzip() is None
    plain = str(tmp_path / "plain.pt")
    w = TorchZipWriter(plain, skeleton)
    assert w.alignment == 64 and all(off % 64 == 0 for off in w.offsets.values())
    _write_all(w, tensors)
    with zipfile.ZipFile(plain) as zf:
        assert zf.read("archive/.storage_alignment") == b"64"


def test_strided_tensor_inside_a_larger_storage(tmp_path):
    base = torch.arange(40.0).view(5, 8)
    path = str(tmp_path / "s.pt")
    torch.save({"t": base[:, 2:6], "u": base.t()}, path)
    infos = dict(tensor_infos(safe_load(path), path))
    filler = BlockFiller(infos)
    assert torch.equal(raw_to_torch(filler.read_rows("t", 1, 4), "float32"), base[1:4, 2:6])
    assert torch.equal(raw_to_torch(filler.read_rows("u", 0, 8), "float32"), base.t())


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = str(tmp_path / "model_optim_rng.pt")
    torch.save({"model": {"w": torch.zeros(2)}, "args": _RunsCode(str(marker))}, path)
    with pytest.raises(UnsafeCheckpoint, match=r"model_optim_rng\.pt.*system.*nothing from the file was executed"):
        safe_load(path)
    assert not marker.exists()


def test_megatron_objects_load_as_inert_stand_ins(tmp_path):
    """A Megatron-LM args pickle (enums, OptimizerConfig) loads in a process that never imports megatron."""
    import json
    import subprocess
    import sys

    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.enums import AttnBackend

    from loaders_tiny import child_env

    path = str(tmp_path / "a.pt")
    torch.save({"args": argparse.Namespace(attention_backend=AttnBackend.flash, params_dtype=torch.bfloat16),
                "opt": OptimizerConfig(lr=0.25)}, path)
    code = (
        "import json, sys, torch\n"
        "from ascend_patch.loaders.torch_io import safe_load, MegatronObject\n"
        f"obj = safe_load({path!r})\n"
        "a = obj['args']\n"
        "print(json.dumps({'enum': type(a.attention_backend).__mro__[1].__name__, 'cls': a.attention_backend.cls,"
        " 'value': a.attention_backend.value, 'lr': obj['opt'].lr, 'dtype': str(a.params_dtype),"
        " 'megatron_imported': any(m.startswith('megatron') for m in sys.modules)}))\n")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"enum": "MegatronObject", "cls": "megatron.core.transformer.enums.AttnBackend",
                   "value": AttnBackend.flash.value, "lr": 0.25, "dtype": "torch.bfloat16", "megatron_imported": False}


def test_truncated_pt_names_the_file(tmp_path):
    path = str(tmp_path / "model_optim_rng.pt")
    torch.save({"model": {"w": torch.randn(256, 256)}}, path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint, match=r"model_optim_rng\.pt"):
        safe_load(path)


def test_conversions_refuse_corrupt_and_hostile_inputs(tmp_path):
    """Through the converter: a truncated shard and a code-running rank file, each named in the error."""
    import shutil

    from ascend_patch.loaders.engine import convert
    from ascend_patch.loaders.formats import ConvertOptions
    from loaders_tiny import make_model, save_model

    hf = save_model(make_model("llama"), str(tmp_path / "hf"), max_shard_size="100KB")
    mg = str(tmp_path / "mg")
    convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=2))
    broken = tmp_path / "broken"
    shutil.copytree(hf, broken)
    shard = sorted(p for p in os.listdir(broken) if p.endswith(".safetensors"))[1]
    data = (broken / shard).read_bytes()
    (broken / shard).write_bytes(data[: len(data) - 4096])
    with pytest.raises(CorruptCheckpoint, match=shard):
        convert(str(broken), str(tmp_path / "out1"), "hf", "mg", ConvertOptions())
    marker = tmp_path / "pwned"
    rank = os.path.join(mg, "iter_0000001", "mp_rank_01", "model_optim_rng.pt")
    torch.save({"model": {}, "args": _RunsCode(str(marker))}, rank)
    with pytest.raises(UnsafeCheckpoint, match="mp_rank_01"):
        convert(mg, str(tmp_path / "out2"), "mg", "hf", ConvertOptions())
    assert not marker.exists()
    assert not os.path.exists(tmp_path / "out1") and not os.path.exists(tmp_path / "out2")


def test_garbage_after_a_pickle_header_is_corrupt_not_hostile(tmp_path):
    # issue 13 item 10: convert died with "KeyError: 213" on such a rank file; then it was called unsafe
    path = str(tmp_path / "model_optim_rng.pt")
    with open(path, "wb") as f:
        f.write(b"\x80\x02" + bytes([213]) * 64)
    with pytest.raises(CorruptCheckpoint, match=r"model_optim_rng\.pt \(66 bytes\) cannot be read as a torch "
                                                r"checkpoint: byte 213 where the pickle needs an opcode"):
        safe_load(path)
    with open(path, "wb") as f:
        f.write(b"GARBAGE!" * 8)
    with pytest.raises(CorruptCheckpoint, match=r"is not a torch checkpoint: it is neither a zip archive"):
        safe_load(path)


@pytest.mark.parametrize("isal", [True, False])
def test_record_crcs_from_pieces_in_any_order_with_copies_gaps_and_overlaps(tmp_path, monkeypatch, isal):
    """Pieces written out of order and copied file to file combine into the record's CRC; pieces that do not
    tile a record (a gap left as zeros, an overlap) fall back to reading it back; zlib alone (no isal) too."""
    import zlib

    if not isal:
        monkeypatch.setattr(torch_zip, "_crc32", zlib.crc32)
        monkeypatch.setattr(torch_zip, "_crc32_combine", None)
    src = tmp_path / "src.bin"
    source = os.urandom(4096)
    src.write_bytes(source)
    skeleton = {"model": {"a": Slot("a", (256,), "float32"), "b": Slot("b", (64,), "float32"),
                          "c": Slot("c", (64,), "float32")}}
    path = str(tmp_path / "m.pt")
    writer = TorchZipWriter(path, skeleton)
    fd = os.open(src, os.O_RDONLY)
    try:
        writer.write("a", 512, memoryview(source[1024:1536]))  # second half first
        writer.copy("a", 0, fd, 0, 512)  # first half file to file
        writer.write("b", 0, memoryview(source[:100]))  # bytes 100..255 never written: zeros
        writer.write("c", 0, memoryview(source[:256]))
        writer.write("c", 128, memoryview(source[2000:2128]))  # an overlap: the second write wins
    finally:
        os.close(fd)
    writer.close()
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
        data = {i.filename.rsplit("/", 1)[-1]: i for i in zf.infolist() if "/data/" in i.filename}
        assert zf.read(data["0"]) == source[:512] + source[1024:1536]
        assert zf.read(data["1"]) == source[:100] + bytes(156)
        assert zf.read(data["2"]) == source[:128] + source[2000:2128]
        assert all(i.CRC == zlib.crc32(zf.read(i)) for i in data.values())


def test_a_crc_cache_reads_a_replicated_range_once_and_never_confuses_ranges(tmp_path, monkeypatch):
    """A tensor copied into several rank files (EP replicas, a tied embedding's last-stage copy) is read once for
    its CRC; another offset, size or file of the same shape is not taken for it."""
    import zlib

    reads = []
    real = torch_zip._crc_of
    monkeypatch.setattr(torch_zip, "_crc_of", lambda fd, off, n: reads.append((off, n)) or real(fd, off, n))
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(os.urandom(2048))
    two.write_bytes(os.urandom(2048))
    cache = torch_zip.CrcCache()
    paths = [str(tmp_path / f"rank{r}.pt") for r in range(3)]
    skeleton = {"model": {"w": Slot("w", (128,), "float32"), "x": Slot("x", (128,), "float32")}}
    fds = [os.open(p, os.O_RDONLY) for p in (one, two)]
    try:
        for r, path in enumerate(paths):
            writer = TorchZipWriter(path, skeleton, crc_cache=cache)
            writer.copy("w", 0, fds[0], 0, 512)  # the same range for every rank
            writer.copy("x", 0, fds[r % 2], 512 * (r // 2), 512)  # a different file or offset per rank
            writer.close()
    finally:
        for fd in fds:
            os.close(fd)
    # read: one.bin [0, 512) (w, and rank 0's x), two.bin [0, 512), one.bin [512, 1024); the other four are hits
    assert cache.hits == 3 and sorted(reads) == [(0, 512), (0, 512), (512, 512)]
    for r, path in enumerate(paths):
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None
            data = {i.filename.rsplit("/", 1)[-1]: i for i in zf.infolist() if "/data/" in i.filename}
            assert data["0"].CRC == zlib.crc32(one.read_bytes()[:512])
            assert data["1"].CRC == zlib.crc32((one, two)[r % 2].read_bytes()[512 * (r // 2):512 * (r // 2) + 512])


def test_a_source_block_several_files_read_is_read_once_and_kept_no_longer():
    """Row-parallel TP ranks read the same source rows in turn: one read serves both, and nothing is kept after
    the last of them (the read cache held up to 4 blocks, of any tensor, per writer thread)."""
    import numpy as np

    from ascend_patch.loaders.formats import TensorInfo
    from ascend_patch.models.weightmap import Piece, TensorPlan

    source = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    reads = []

    def reader(start, stop):  # a loader's reader: the filler asks it for rows
        reads.append((start, stop))
        return source[start:stop]

    filler = BlockFiller({"w": TensorInfo(path="mem", shape=(8, 6), dtype="float32", reader=reader)})
    # two TP ranks of a row-parallel weight: the same rows, columns 0..2 and 3..5
    ranks = [TensorPlan(f"rank{r}", (8, 3), (Piece("w", (0, 3 * r), (0, 0), (8, 3)),)) for r in range(2)]
    for start, stop in ((0, 4), (4, 8)):
        filler.expect(ranks, start, stop)
        for r, plan in enumerate(ranks):
            out = np.empty((stop - start, 3), dtype=np.uint32)
            filler.fill(plan, start, stop, out, "float32")
            assert torch.equal(raw_to_torch(out, "float32"), source[start:stop, 3 * r:3 * r + 3])
        assert filler._kept == {}  # the last reader took it
    assert reads == [(0, 4), (4, 8)]  # once per block, not once per rank
    # column-parallel ranks read different rows: nothing is kept for them at all
    split = [TensorPlan(f"rank{r}", (4, 6), (Piece("w", (4 * r, 0), (0, 0), (4, 6)),)) for r in range(2)]
    filler.expect(split, 0, 4)
    filler.fill(split[0], 0, 4, np.empty((4, 6), dtype=np.uint32), "float32")
    assert filler._kept == {} and reads[-1] == (0, 4)
