"""The torch-free readers of torch_dist's pickles agree with torch's own, and fall back to torch for the rest.

The reference is torch itself: ``FileSystemReader.read_metadata`` for ``.metadata``,
``torch.load`` (through ``safe_load`` / the meta-device chunk reader) for ``common.pt`` and each
chunk, on checkpoints both torch.distributed.checkpoint and our saver wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import subprocess
import sys

import pytest
import torch

from ascend_patch.dtypes import canonical
from ascend_patch.loaders.blocks import CorruptCheckpoint
from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.torch_dist_io import _chunk_record_torch, chunk_record, read_common, read_dist_metadata
from ascend_patch.loaders.torch_io import UnsafeCheckpoint, safe_load
from ascend_patch.loaders.torch_pickle import DCP_FIELDS, TorchName
from helpers import child_env


def test_the_field_table_is_torchs():
    from torch.distributed.checkpoint import filesystem, metadata

    for name, fields in DCP_FIELDS.items():
        cls = getattr(metadata, name, None) or getattr(filesystem, name)
        assert tuple(f.name for f in dataclasses.fields(cls)) == fields, name


@pytest.fixture(scope="module")
def torch_written(tmp_path_factory):
    """A checkpoint torch.distributed.checkpoint wrote: dtypes, a non-contiguous tensor, a view, bytes."""
    import io

    import torch.distributed.checkpoint as dcp

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=gen)
    state = {"a": torch.randn(3, 4, generator=gen).to(torch.bfloat16), "t": base.t(), "view": base[2:4],
             "i": torch.arange(7, dtype=torch.int64), "h": torch.randn(2, 2, generator=gen).half(),
             "obj": io.BytesIO(b"\x00\x01 raw bytes")}
    root = tmp_path_factory.mktemp("dcp")
    dcp.save(state, checkpoint_id=str(root), no_dist=True)
    return root, state


@pytest.fixture(scope="module")
def ours(hf_checkpoint, tmp_path_factory):
    hf, _ = hf_checkpoint("qwen3")
    root = tmp_path_factory.mktemp("ours")
    convert(hf, str(root / "dist"), "hf", "torch_dist")
    return root / "dist" / "iter_0000001"


def _torch_view(md):
    """Every field the loader reads, from torch's objects or ours, in plain types."""
    tensors, objects = {}, []
    for key, item in md.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            tensors[key] = (canonical(item.properties.dtype), tuple(item.size),
                            [(tuple(c.offsets), tuple(c.sizes)) for c in item.chunks])
        else:
            objects.append(key)
    storage = {(i.fqn, None if i.offset is None else tuple(i.offset)):
               (s.relative_path, s.offset, s.length, s.transform_descriptors) for i, s in md.storage_data.items()}
    return tensors, sorted(objects), storage


@pytest.mark.parametrize("which", ["torch_written", "ours"])
def test_metadata_and_chunks_read_as_torch_reads_them(which, request):
    from torch.distributed.checkpoint import FileSystemReader

    root = request.getfixturevalue(which)
    root = root[0] if isinstance(root, tuple) else root
    got = read_dist_metadata(str(root / ".metadata"))
    want = FileSystemReader(str(root)).read_metadata()
    assert _torch_view(got) == _torch_view(want)
    assert _torch_view(got)[0] and _torch_view(got)[1]  # tensors and objects both present
    checked = 0
    for index, info in got.storage_data.items():
        if index.offset is None:
            continue
        path = str(root / info.relative_path)
        fd = os.open(path, os.O_RDONLY)
        try:
            mine, theirs = chunk_record(fd, path, info.offset, info.length), _chunk_record_torch(fd, path, info.offset,
                                                                                                 info.length)
        finally:
            os.close(fd)
        assert (mine.data_offset, mine.shape, mine.stride, mine.dtype) == (
            theirs.data_offset, theirs.shape, theirs.stride, canonical(theirs.dtype)), index.fqn
        checked += 1
    assert checked == sum(len(v[2]) for v in _torch_view(got)[0].values())


def test_chunk_bytes_are_the_tensors(torch_written):
    """The located records hold exactly the values torch saved (a transposed tensor keeps its strides)."""
    root, state = torch_written
    md = read_dist_metadata(str(root / ".metadata"))
    for index, info in md.storage_data.items():
        if index.offset is None:
            continue
        path = str(root / info.relative_path)
        fd = os.open(path, os.O_RDONLY)
        try:
            rec = chunk_record(fd, path, info.offset, info.length)
            want = state[index.fqn]
            span = (1 + sum((d - 1) * s for d, s in zip(rec.shape, rec.stride))) * want.element_size()
            raw = bytearray(os.pread(fd, span, rec.data_offset))
        finally:
            os.close(fd)
        flat = torch.frombuffer(raw, dtype=want.dtype)
        got = torch.as_strided(flat, rec.shape, rec.stride)
        assert torch.equal(got, want), index.fqn


def test_common_reads_as_safe_load_reads_it(ours):
    got, want = read_common(str(ours / "common.pt")), safe_load(str(ours / "common.pt"))
    assert set(got) == set(want) and {k: got[k] for k in got if k != "args"} == {k: want[k] for k in want if k != "args"}
    mine, theirs = vars(got["args"]), vars(want["args"])
    assert set(mine) == set(theirs) and {k: str(v) for k, v in mine.items()} == {k: str(v) for k, v in theirs.items()}
    assert isinstance(got["args"].params_dtype, TorchName) and isinstance(want["args"].params_dtype, torch.dtype)
    assert str(got["args"].params_dtype) == str(want["args"].params_dtype) == "torch.float32"


def test_what_the_torch_free_readers_do_not_model_goes_to_torch(tmp_path):
    path = str(tmp_path / "common.pt")
    torch.save({"args": argparse.Namespace(x=1), "rng": torch.arange(3)}, path)
    got = read_common(path)  # a tensor: torch reads it (on the meta device, as safe_load does)
    assert isinstance(got["rng"], torch.Tensor) and got["rng"].shape == (3,) and got["rng"].dtype == torch.int64
    torch.save({"args": argparse.Namespace(when=__import__("datetime").date(2020, 1, 1))}, path)
    with pytest.raises(UnsafeCheckpoint, match="datetime"):  # refused as safe_load refuses it
        read_common(path)


def test_hostile_pickles_run_nothing(tmp_path, ours):
    import zipfile

    data = open(ours / "common.pt", "rb").read()
    path = tmp_path / "common.pt"
    with zipfile.ZipFile(ours / "common.pt") as z, zipfile.ZipFile(path, "w") as out:
        for name in z.namelist():
            out.writestr(name, pickle.dumps(os.system, protocol=2) if name.endswith("data.pkl") else z.read(name))
    assert data  # the original is untouched
    with pytest.raises(UnsafeCheckpoint, match="system"):
        read_common(str(path))
    meta = tmp_path / ".metadata"
    meta.write_bytes(pickle.dumps(os.system))
    with pytest.raises(CorruptCheckpoint, match=r"names posix\.system"):
        read_dist_metadata(str(meta))


def test_reading_torch_dist_does_not_import_torch(ours, tmp_path):
    code = ("import sys; from ascend_patch.loaders.engine import convert; "
            f"r = convert({str(ours.parent)!r}, {str(tmp_path / 'hf')!r}, 'mg', 'hf'); "
            "print(r.source.format, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torch_dist", "False"]


def test_archives_the_fast_directory_read_declines_still_read_and_damage_is_named(tmp_path):
    """An archive with a zip comment (not what torch.save writes) goes through zipfile and reads the same; a chunk
    cut short or pointing outside itself is refused naming the file."""
    import io
    import zipfile

    from ascend_patch.loaders.torch_dist_io import _directory

    buf = io.BytesIO()
    torch.save(torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), buf)
    plain = buf.getvalue()
    commented = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain)) as src, zipfile.ZipFile(commented, "w") as out:
        for info in src.infolist():
            out.writestr(info, src.read(info))
        out.comment = b"re-zipped"
    path = tmp_path / "__0_0.distcp"
    pad = b"\x07" * 100  # the items sit at an offset in the file, as in a .distcp
    path.write_bytes(pad + plain + commented.getvalue())
    fd = os.open(path, os.O_RDONLY)
    try:
        first = (len(pad), len(plain))
        second = (len(pad) + len(plain), len(commented.getvalue()))
        assert _directory(fd, *first) is not None and _directory(fd, *second) is None
        recs = [chunk_record(fd, str(path), *item) for item in (first, second)]
        theirs = _chunk_record_torch(fd, str(path), *second)
        for rec in recs:
            assert (rec.shape, rec.stride, rec.dtype) == ((4, 3), (1, 4), "float32")
            raw = os.pread(fd, 48, rec.data_offset)
            assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32), torch.arange(12.0))
        assert recs[1].data_offset == theirs.data_offset
        with pytest.raises(CorruptCheckpoint, match="__0_0.distcp"):
            chunk_record(fd, str(path), len(pad), len(plain) - 40)  # the item's end (its directory) cut off
    finally:
        os.close(fd)
    # a pickle naming another function: torch's weights-only reader gets it, and refuses it without suggesting
    # weights_only=False (which would run it)
    path.write_bytes(pad + plain.replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_vX"))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(UnsafeCheckpoint, match=r"__0_0.distcp \(the item at byte 100\): refusing to unpickle "
                                                   r"torch._utils._rebuild_tensor_vX") as err:
            chunk_record(fd, str(path), len(pad), len(plain))
        assert "nothing from the file was executed" in str(err.value) and "weights_only` set to `False`" not in str(
            err.value)
    finally:
        os.close(fd)


def test_every_torch_dtype_reads_as_its_name():
    """A dtype the converter does not handle (fp8, complex) still reads, so the converter can name it."""
    from ascend_patch.loaders.torch_pickle import load_metadata

    names = sorted(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))
    got = load_metadata(pickle.dumps([getattr(torch, n) for n in names], protocol=2))
    assert [str(g) for g in got] == [str(getattr(torch, n)) for n in names]


def test_damaged_torch_dist_files_are_refused_naming_the_damage(ours, tmp_path):
    """Seeded byte flips and truncations of .metadata, common.pt and the .distcp files: every conversion either
    succeeds (a flipped tensor byte is data) or raises the converter's own error, never a bare exception (a
    misspelt class name in .metadata once read as a fieldless stand-in and failed with an AttributeError)."""
    import random
    import shutil

    from ascend_patch.errors import AscendPatchError

    rng = random.Random(7)
    names = sorted(n for n in os.listdir(ours) if n != "metadata.json")
    outcomes = []
    for case in range(30):
        work = tmp_path / f"w{case}"
        shutil.copytree(ours.parent, work)
        path = work / ours.name / names[case % len(names)]
        data = bytearray(path.read_bytes())
        if case % 3 == 2:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(data)) if case % 3 == 0 else len(data) - rng.randint(1, min(len(data), 2000))
                data[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        try:
            convert(str(work), str(tmp_path / f"out{case}"), "mg", "hf")
            outcomes.append("ok")
        except AscendPatchError as exc:
            outcomes.append(type(exc).__name__)
        shutil.rmtree(work)
    assert set(outcomes) <= {"ok", "CorruptCheckpoint", "UnsafeCheckpoint", "PreflightError"}, outcomes
    assert outcomes.count("ok") < len(outcomes) and "CorruptCheckpoint" in outcomes
    work = tmp_path / "misspelt"
    shutil.copytree(ours.parent, work)
    meta = work / ours.name / ".metadata"
    meta.write_bytes(meta.read_bytes().replace(b"_StorageInfo", b"_StoraweInfo"))  # torch has no such class
    with pytest.raises(CorruptCheckpoint, match=r"\.metadata cannot be read .*_StoraweInfo"):
        convert(str(work), str(tmp_path / "out"), "mg", "hf")


@pytest.mark.parametrize("reader", ["records", "torch"])
def test_metadata_with_megatron_cores_save_plans_reads(tmp_path, monkeypatch, reader):
    """megatron-core 0.12-0.14's planner makes its plans as MCoreSavePlan (a SavePlan with mcore_data), and torch
    2.13 keeps every rank's plan in the metadata: the converter reads those checkpoints (both readers)."""
    from typing import Any

    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
    from torch.distributed.checkpoint.metadata import TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan

    from ascend_patch.loaders import torch_dist_io

    @dataclasses.dataclass(frozen=True)
    class MCoreSavePlan(SavePlan):  # as those releases define it (the installed 0.16 keeps an empty class of the name)
        mcore_data: dict[str, dict[str, Any]] = None

    MCoreSavePlan.__module__, MCoreSavePlan.__qualname__ = mcore_torch.__name__, "MCoreSavePlan"
    monkeypatch.setattr(mcore_torch, "MCoreSavePlan", MCoreSavePlan)

    chunk = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([4]))
    metadata = Metadata(state_dict_metadata={"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                                         torch.Size([4]), [chunk])},
                        storage_data={})
    metadata.all_local_plans = [MCoreSavePlan(items=[], mcore_data={"w": {}})]
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(metadata))
    if reader == "records":
        got = read_dist_metadata(str(path))
        (plan,) = got.all_local_plans
        assert plan.cls == "megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan"
        assert plan.mcore_data == {"w": {}}
    else:
        got = torch_dist_io._read_metadata_torch(str(path), path.read_bytes())
        (plan,) = got.all_local_plans
        assert isinstance(plan, SavePlan) and plan.mcore_data == {"w": {}}
    assert tuple(got.state_dict_metadata["w"].size) == (4,)
