"""torch.distributed.checkpoint files, model-free: read the metadata, find each item's bytes, write items.

A torch_dist folder (megatron-core's ``dist_checkpointing`` on top of
``torch.distributed.checkpoint``) holds ``.metadata`` — a pickled
:class:`~torch.distributed.checkpoint.metadata.Metadata`: every key's global shape, dtype
and chunks (``state_dict_metadata``) and where each chunk's bytes are
(``storage_data``: ``MetadataIndex(fqn, offset)`` -> ``_StorageInfo(relative_path, offset,
length)``) — and ``__R_I.distcp`` files in which each chunk is a complete ``torch.save``
archive of one tensor (``FileSystemWriter`` with the default ``torch_save`` serialization),
or raw bytes for a non-tensor item (megatron-core's ``ShardedObject``: ``torch.save`` of a
list).

Reading imports neither torch nor torch.distributed.checkpoint (together ~330 MB resident
and ~2 s of CPU, more than streaming a 1 GB model): :mod:`.torch_pickle` unpickles
``.metadata`` into stand-ins with the fields of DCP's own types, restricted to those types
(``FileSystemReader.read_metadata`` unpickles with no allowlist, and a checkpoint is input
we did not write), and ``common.pt`` with ``safe_load``'s allowlist. Each chunk's tensor
record is located inside its embedded archive from the archive's own directory
(``zipfile``) and the tensor's small pickle (a ``_rebuild_tensor_v2`` call: storage key,
offset, shape, stride), so the converter streams it like any other tensor; whatever the
torch-free readers do not model is read by torch as before. Writing builds the same
``Metadata`` objects and lays each item out as ``torch.save`` would (:mod:`.torch_zip`),
so the data streams in afterwards.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..dtypes import DTYPES
from .blocks import CorruptCheckpoint
from .pickle_write import GlobalCall as _Call
from .pickle_write import dumps
from .torch_zip import TORCH_DTYPES, Slot, TorchGlobal, TorchZipWriter, zip_bytes, zip_layout

__all__ = [
    "ChunkRecord",
    "DistItem",
    "DistcpWriter",
    "chunk_record",
    "dumps_metadata",
    "item_length",
    "read_common",
    "read_dist_metadata",
    "EXTRA_STATE_BYTES",
]

# megatron-core stores a ShardedObject as torch.save([data, ...]); the local spec's linear layers'
# extra state is None (it exists only so the key set matches the Transformer-Engine spec's)
EXTRA_STATE_BYTES = zip_bytes([None])


def read_dist_metadata(path: str) -> Any:
    """The ``Metadata`` in the file ``path`` (a ``.metadata``), read without importing torch.

    Its objects are :class:`~.torch_pickle.DcpRecord` stand-ins with the fields of
    torch.distributed.checkpoint's classes (``state_dict_metadata``, ``storage_data``, a
    chunk's ``offsets`` / ``sizes`` as tuples, ``properties.dtype`` whose ``str()`` is
    torch's); nothing but those types, dtypes, sizes and paths is unpickled. A pickle naming
    a class of that package the stand-ins do not model is read with torch's own classes.
    """
    from .torch_pickle import DcpRecord, NeedsTorch, RefusedGlobal, load_metadata

    try:
        with open(path, "rb") as f:
            data = f.read()
        try:
            metadata = load_metadata(data)
        except NeedsTorch:  # a class of torch.distributed.checkpoint the stand-ins do not know: torch's own
            return _read_metadata_torch(path, data)
    except RefusedGlobal as exc:
        raise CorruptCheckpoint(f"the torch_dist metadata names {exc.path}, which a checkpoint's metadata never "
                                "holds; refusing to unpickle it (nothing from the file was executed)") from None
    except CorruptCheckpoint:
        raise
    except Exception as exc:
        raise CorruptCheckpoint(f"{path} cannot be read as torch.distributed.checkpoint metadata: {exc} "
                                "(truncated or written by something else?)") from None
    if not (isinstance(metadata, DcpRecord) and metadata.cls.endswith(".Metadata")
            and isinstance(metadata.state_dict_metadata, dict)):
        raise CorruptCheckpoint(f"{path} holds a {type(metadata).__name__}, not torch.distributed.checkpoint Metadata")
    if not isinstance(metadata.storage_data, dict):
        raise CorruptCheckpoint(f"{path} has no storage_data (where each chunk is); it was not written by "
                                "torch.distributed.checkpoint's file-system writer")
    return metadata


class _TorchMetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's own types, torch.Size, dtypes, paths; nothing else is constructed."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        from .torch_pickle import MEGATRON_PLANS, RefusedGlobal

        if module.startswith("torch.distributed.checkpoint.") or (module, name) == ("torch.serialization",
                                                                                   "_get_layout"):
            return super().find_class(module, name)
        if (module, name) in MEGATRON_PLANS:  # megatron-core's SavePlan subclass: torch's SavePlan holds its fields
            from torch.distributed.checkpoint.planner import SavePlan

            return SavePlan
        if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            return super().find_class(module, name)
        if module == "torch" and (name in ("Size", "device", "layout", "strided", "contiguous_format",
                                           "preserve_format", "channels_last", "channels_last_3d", "memory_format")
                                  or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        raise RefusedGlobal(f"{module}.{name}")


def _read_metadata_torch(path: str, data: bytes) -> Any:
    """:func:`read_dist_metadata` with torch's own classes, for a pickle naming classes the stand-ins lack."""
    from torch.distributed.checkpoint.metadata import Metadata

    metadata = _TorchMetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict) \
            or not isinstance(metadata.storage_data, dict):
        raise CorruptCheckpoint(f"{path} holds a {type(metadata).__name__}, not torch.distributed.checkpoint Metadata "
                                "with storage_data")
    return metadata


def read_common(path: str) -> Any:
    """The object in a torch_dist ``common.pt`` (Megatron's ``args``, the iteration), read like
    :func:`.torch_io.safe_load` reads it — same allowlist, Megatron stand-ins — without importing torch.

    torch's dtypes in it are :class:`~.torch_pickle.TorchName`. A file holding tensors or any
    global the torch-free reader does not model goes to ``safe_load`` (which imports torch, and
    refuses what is not allowed as before).
    """
    import functools

    from .torch_io import _base_allowlist, _stand_in, check_archive, safe_load
    from .torch_pickle import NeedsTorch, load_plain

    if not os.path.isfile(path):
        raise CorruptCheckpoint(f"{path} does not exist")
    if check_archive(path) is not None:  # a zip archive (None: a legacy bare pickle, left to torch)
        allowed = {}
        for entry in _base_allowlist():
            obj, name = entry if isinstance(entry, tuple) else (entry, f"{entry.__module__}.{entry.__qualname__}")
            allowed[name] = obj
        try:
            with zipfile.ZipFile(path) as archive:
                data = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")
                                         and n.count("/") == 1))
            return load_plain(data, allowed, functools.lru_cache(maxsize=None)(_stand_in))
        except NeedsTorch:
            pass
        except Exception:  # damaged in a way torch's reader words best: let it say so
            pass
    return safe_load(path)


class _FileView(io.RawIOBase):
    """Bytes [offset, offset + length) of an open file, read on demand (zipfile / torch.load read little)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd, self.base, self.length, self.pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.length + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self.length - self.pos))
        data = os.pread(self.fd, n, self.base + self.pos) if n else b""
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass(frozen=True)
class ChunkRecord:
    """Where one chunk's tensor data is in its ``.distcp`` file, and its layout there."""

    data_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any  # a dtype name (a torch.dtype where torch read the archive)


def chunk_record(fd: int, path: str, offset: int, length: int) -> ChunkRecord:
    """Locate the tensor saved at ``[offset, offset + length)`` of ``path`` (a ``torch.save`` archive).

    The archive's own directory (``zipfile``) and its small pickle say where the tensor's
    record is and how it views it; no tensor data is read, and torch is not imported unless
    the pickle holds something other than one plain tensor (then ``torch.load`` on the meta
    device reads it, as it always did).
    """
    from .torch_pickle import NeedsTorch, load_tensor

    try:
        infos = _directory(fd, offset, length)
        archive = None
        if infos is None:  # anything but the plain archive torch.save writes: zipfile reads it
            archive = zipfile.ZipFile(_FileView(fd, offset, length))
            infos = archive.infolist()
        records = [i for i in infos if "/data/" in i.filename and not i.filename.endswith("/")]
        pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError(f"{len(pickles)} data.pkl records")
        if archive is not None:
            data = archive.read(pickles[0])
        else:
            at = _record_data(fd, path, offset, pickles[0])
            data = os.pread(fd, pickles[0].file_size, at)
            if len(data) != pickles[0].file_size or at + len(data) > offset + length:
                raise ValueError("its data.pkl ends past the item")
        tensor = load_tensor(data)
    except NeedsTorch:
        return _chunk_record_torch(fd, path, offset, length)
    except Exception as exc:
        raise CorruptCheckpoint(f"{path}: the item at bytes {offset}..{offset + length} is not a torch.save archive "
                                f"of a tensor ({exc}); the file is truncated or was written differently") from None
    if len(records) != 1 or records[0].filename != f"{pickles[0].filename[:-len('data.pkl')]}data/{tensor.storage.key}":
        raise CorruptCheckpoint(f"{path}: the item at byte {offset} holds a tensor with {len(records)} data records, "
                                "not one record of its storage")
    element = DTYPES[tensor.dtype].itemsize
    extent = (tensor.storage_offset + 1 + sum((d - 1) * s for d, s in zip(tensor.shape, tensor.stride))) \
        if all(tensor.shape) else 0
    start = _record_data(fd, path, offset, records[0])
    if extent > tensor.storage.numel or tensor.storage.numel * element != records[0].file_size \
            or start + records[0].file_size > offset + length:
        raise CorruptCheckpoint(f"{path}: the tensor at byte {offset} ({tensor.dtype}{list(tensor.shape)}) does not fit "
                                f"its storage record of {records[0].file_size} bytes inside the item (damaged)")
    return ChunkRecord(start + tensor.storage_offset * element, tensor.shape, tensor.stride, tensor.dtype)


class _Record(NamedTuple):
    """The fields of a ``zipfile.ZipInfo`` the chunk reader uses."""

    filename: str
    header_offset: int
    file_size: int
    compress_type: int


_END = struct.Struct("<4s4H2LH")  # end of central directory
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # a central directory entry


def _directory(fd: int, offset: int, length: int) -> list[_Record] | None:
    """The records of the small archive at ``[offset, offset + length)`` from one read of its tail.

    ``zipfile`` takes ~8 reads and ~250 us of Python per archive, which for an MoE
    checkpoint's thousands of chunks is most of its start-up. This reads only the plain
    form ``torch.save`` writes for an archive under 4 GB — no comment, no zip64 sizes or
    offsets, the directory right before its end record or before the zip64 end record and
    locator torch's writer adds — and returns None for anything else, which ``zipfile``
    then reads (or rejects with its own message).
    """
    tail = min(length, 8192)
    buf = os.pread(fd, tail, offset + length - tail)
    if len(buf) != tail or tail < _END.size:
        return None
    end = tail - _END.size
    sig, disk, cd_disk, count, total, cd_size, cd_offset, comment = _END.unpack_from(buf, end)
    gap = length - _END.size - cd_offset - cd_size  # torch's writer puts zip64 end records there (56 + 20 bytes)
    if sig != b"PK\x05\x06" or comment or disk or cd_disk or count != total or cd_size + gap > end or not (
            gap == 0 or (gap == 76 and buf[end - 76:end - 72] == b"PK\x06\x06" and buf[end - 20:end - 16] == b"PK\x06\x07")):
        return None
    end -= gap
    pos, out = end - cd_size, []
    for _ in range(count):
        if pos + _CENTRAL.size > end:
            return None
        (sig, _, _, _, method, _, _, _, csize, size, name_len, extra_len, comment_len, _, _, _,
         header) = _CENTRAL.unpack_from(buf, pos)
        if sig != b"PK\x01\x02" or 0xFFFFFFFF in (csize, size, header) or csize != size:
            return None
        name = buf[pos + _CENTRAL.size:pos + _CENTRAL.size + name_len].decode("utf-8", "replace")
        out.append(_Record(name, header, size, method))
        pos += _CENTRAL.size + name_len + extra_len + comment_len
    return out if pos == end else None


def _record_data(fd: int, path: str, offset: int, info: Any) -> int:
    """The file offset of a stored record's first byte (after its local header)."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise CorruptCheckpoint(f"{path}: the tensor record at byte {offset} is compressed; torch.save never does that")
    name = info.filename.encode()
    header = os.pread(fd, 30 + len(name), offset + info.header_offset)
    name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    if header[:4] != b"PK\x03\x04" or name_len != len(name) or header[30:] != name:
        raise CorruptCheckpoint(f"{path}: the item at byte {offset} has no local header for {info.filename} (damaged)")
    return offset + info.header_offset + 30 + name_len + extra_len


def _chunk_record_torch(fd: int, path: str, offset: int, length: int) -> ChunkRecord:
    """:func:`chunk_record` through ``torch.load`` on the meta device, for archives the torch-free reader does not
    model (a tensor subclass, a storage type it does not know)."""
    import torch

    try:
        archive = zipfile.ZipFile(_FileView(fd, offset, length))
        records = [i for i in archive.infolist() if "/data/" in i.filename and not i.filename.endswith("/")]
        tensor = torch.load(io.BufferedReader(_FileView(fd, offset, length)), map_location="meta", weights_only=True)
    except Exception as exc:
        from .torch_io import _ANY_GLOBAL, _unsafe

        named = _ANY_GLOBAL.search(str(exc))
        if named:  # torch's own message would suggest weights_only=False, which runs the file
            raise _unsafe(f"{path} (the item at byte {offset})", named.group(1) or named.group(2)) from None
        raise CorruptCheckpoint(f"{path}: the item at bytes {offset}..{offset + length} is not a torch.save archive "
                                f"of a tensor ({exc}); the file is truncated or was written differently") from None
    if not isinstance(tensor, torch.Tensor) or len(records) != 1:
        raise CorruptCheckpoint(f"{path}: the item at byte {offset} holds {type(tensor).__name__} with "
                                f"{len(records)} data records, not one tensor")
    element = tensor.element_size()
    return ChunkRecord(_record_data(fd, path, offset, records[0]) + tensor.storage_offset() * element,
                       tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


# -- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistItem:
    """One item to write: a tensor chunk (``slot``) or a ShardedObject's bytes (``data``).

    ``fqn`` is the key in ``state_dict_metadata``; ``global_shape`` / ``offsets`` place a
    tensor chunk in its global tensor (the chunk's shape is ``slot.shape``).
    """

    fqn: str
    slot: Slot | None = None
    data: bytes | None = None
    global_shape: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()


def item_length(item: DistItem) -> int:
    """Bytes the item takes in its ``.distcp`` file."""
    if item.slot is None:
        return len(item.data or b"")
    return _archive_length(item.slot.shape, item.slot.dtype)


@functools.lru_cache(maxsize=1024)
def _archive_length(shape: tuple[int, ...], dtype: str) -> int:
    # a one-tensor archive's size depends on the shape and dtype only (its record is named "0"); a plan
    # asks 3 times per item and one chunk per layer repeats every shape, so a layout (~55 us) is made once
    return zip_layout(Slot("0", shape, dtype)).total


class DistcpWriter:
    """One ``.distcp`` file: each tensor item a ``torch.save`` archive laid out up front, written by sid."""

    def __init__(self, path: str, items: Sequence[DistItem]) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._zips: dict[str, TorchZipWriter] = {}
        pos = 0
        try:
            for item in items:
                if item.slot is None:
                    os.pwrite(self.fd, item.data or b"", pos)
                    pos += len(item.data or b"")
                    continue
                writer = TorchZipWriter(path, item.slot, fd=self.fd, base=pos)
                self._zips[item.slot.sid] = writer
                pos += writer.total
            os.ftruncate(self.fd, pos)
        except BaseException:
            os.close(self.fd)
            raise
        self.total = pos

    def write(self, sid: str, byte_offset: int, data: memoryview) -> None:
        self._zips[sid].write(sid, byte_offset, data)

    def copy(self, sid: str, byte_offset: int, src_fd: int, src_offset: int, nbytes: int) -> None:
        self._zips[sid].copy(sid, byte_offset, src_fd, src_offset, nbytes)

    def close(self) -> None:
        if self.fd < 0:
            return
        for writer in self._zips.values():
            writer.close()
        os.close(self.fd)
        self.fd = -1

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_DCP = "torch.distributed.checkpoint.metadata"
DCP_VERSION = "1.0.0"  # torch.distributed.checkpoint.filesystem.CURRENT_DCP_VERSION of the torch this was built on


def _size(dims: Sequence[int]) -> _Call:
    return _Call("torch", "Size", tuple(int(d) for d in dims))


def dumps_metadata(files: Sequence[tuple[str, Sequence[DistItem]]], dtypes: dict[str, str]) -> bytes:
    """The pickled ``Metadata`` describing ``files`` ((relative path, items in file order)).

    ``dtypes`` maps each tensor fqn to its dtype name. Items of one tensor fqn must agree on
    the global shape; together they must cover it (the saver guarantees that).

    The pickle calls the constructors of torch.distributed.checkpoint's own types
    (``Metadata``, ``TensorStorageMetadata(TensorProperties(dtype), torch.Size, chunks)``,
    ``MetadataIndex``, ``_StorageInfo``, ...), so whoever loads it gets exactly the objects
    torch's writer would have pickled (the tests compare them); it is written without
    importing torch, whose import would cost a conversion more than its streaming does.
    """
    state: dict[str, Any] = {}
    chunks: dict[str, list[Any]] = {}
    storage: dict[Any, Any] = {}
    for relpath, items in files:
        pos = 0
        for item in items:
            length = item_length(item)
            if item.slot is None:
                state[item.fqn] = _Call(_DCP, "BytesStorageMetadata")
                index = _Call(_DCP, "MetadataIndex", item.fqn)
            else:
                if item.fqn not in state:
                    chunks[item.fqn] = []
                    props = _Call(_DCP, "TensorProperties", TORCH_DTYPES[dtypes[item.fqn]])
                    state[item.fqn] = _Call(_DCP, "TensorStorageMetadata", props, _size(item.global_shape),
                                            chunks[item.fqn])
                chunks[item.fqn].append(_Call(_DCP, "ChunkStorageMetadata", _size(item.offsets), _size(item.slot.shape)))
                index = _Call(_DCP, "MetadataIndex", item.fqn, _size(item.offsets))
            storage[index] = _Call("torch.distributed.checkpoint.filesystem", "_StorageInfo", relpath, pos, length)
            pos += length
    metadata = _Call(_DCP, "Metadata", state, None, storage, None, DCP_VERSION)
    return dumps(metadata)
