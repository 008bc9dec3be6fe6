"""Write ``torch.save``-format files without importing torch.

A torch checkpoint is a zip archive (entries stored, not compressed): ``data.pkl`` — a
protocol-2 pickle in which each tensor is ``torch._utils._rebuild_tensor_v2(storage, ...)``
and each storage a persistent id ``("storage", torch.<Type>Storage, key, "cpu", numel)`` —
plus ``data/<key>`` records holding the raw bytes, ``byteorder``, ``.storage_alignment``
and ``version``. Since the plan knows every shape, the whole archive is laid out up front;
tensor bytes are then written (or copied file-to-file) at their offsets.

Records are 64-byte aligned as ``torch.save`` writes them, unless the caller gives a
tensor's offset within a page in its source file (``page_offsets``): its record is then
placed at that same offset within a page, so a file-to-file copy moves whole pages
(``copy_file_range`` measured 1.5x faster on ext4 than with every page split in two).
Such records are aligned to the tensor's element size, which is all ``torch.load``
needs; ``.storage_alignment`` states the alignment every record of the file has.

Importing torch costs this process ~4 s and ~220 MB resident on the project's machines, as
much as copying a small model; hf -> mg therefore never imports it. ``torch.load`` (also
with ``weights_only=True`` and ``mmap=True``) and ``zipfile`` read the result; the tests
check both.
"""

from __future__ import annotations

import math
import collections
import io
import os
import pickle
import struct
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..dtypes import DTYPES, itemsize

__all__ = ["CrcCache", "Slot", "TorchGlobal", "TORCH_DTYPES", "TorchZipWriter", "ZIP64_LIMIT", "ZipLayout",
           "zip_layout", "zip_bytes"]

ALIGN = 64
PAGE = 4096
ZIP64_LIMIT = 0xFFFFFFFF  # sizes / offsets at or above this need zip64 records


@dataclass(frozen=True)
class TorchGlobal:
    """A reference to ``module.name`` written into the pickle without importing it (``torch.bfloat16``)."""

    module: str
    name: str

    def __call__(self, *args: Any) -> Any:  # pickle wants reduce functions callable; this one is never called
        raise TypeError(f"{self.module}.{self.name} is only a reference for pickling")


TORCH_DTYPES = {name: TorchGlobal("torch", name) for name in DTYPES}


@dataclass(frozen=True)
class Slot:
    """A tensor to be written: its id (unique in the file), shape and dtype name."""

    sid: str
    shape: tuple[int, ...]
    dtype: str


class _StorageRef:
    def __init__(self, key: str, dtype: str, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _TensorReduce:
    """Pickles as ``_rebuild_tensor_v2(storage, 0, shape, stride, False, OrderedDict())``."""

    def __init__(self, storage: _StorageRef, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def __reduce__(self) -> Any:
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= d
        return (TorchGlobal("torch._utils", "_rebuild_tensor_v2"),
                (self.storage, 0, tuple(self.shape), tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle._Pickler):  # the pure-Python pickler lets save() be extended
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            return ("storage", TorchGlobal("torch", DTYPES[obj.dtype].storage), obj.key, "cpu", obj.numel)
        return None

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, TorchGlobal):
            self.write(pickle.GLOBAL + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")
            return
        super().save(obj, save_persistent_id)


def _slots(obj: Any) -> Iterator[Slot]:
    if isinstance(obj, Slot):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _slots(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _slots(v)


def _substitute(obj: Any, refs: dict[str, _TensorReduce]) -> Any:
    if isinstance(obj, Slot):
        return refs[obj.sid]
    if isinstance(obj, dict):
        return type(obj)((k, _substitute(v, refs)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_substitute(v, refs) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_substitute(v, refs) for v in obj)
    return obj


@dataclass
class _Entry:
    name: str
    size: int
    header_offset: int = 0
    data_offset: int = 0
    crc: int = 0
    zip64: bool = False
    pad: int = 0

    # Built when a local header is written, not kept: the page-alignment padding is up to 4 KB of zeros
    # per record, which for an MoE rank file's thousands of expert tensors would be megabytes held
    # for the writer's lifetime.
    @property
    def extra(self) -> bytes:
        return ((struct.pack("<HHQQ", 0x0001, 16, self.size, self.size) if self.zip64 else b"")
                + struct.pack("<HH", 0x4246, self.pad) + b"\0" * self.pad)  # "FB": the padding id torch uses

    @property
    def extra_len(self) -> int:
        return (20 if self.zip64 else 0) + 4 + self.pad


try:  # ISA-L's CRC-32 (and its combine), ~3x zlib's here; zlib is the fallback where the wheel is missing
    from isal.isal_zlib import crc32 as _crc32
    from isal.isal_zlib import crc32_combine as _crc32_combine
except ImportError:  # pragma: no cover - isal is a dependency
    _crc32 = zlib.crc32
    _crc32_combine = None

_CRC_CHUNK = 8 * 1024 * 1024


@dataclass
class ZipLayout:
    """Where everything of one archive goes, relative to its first byte (computed without writing)."""

    entries: list[_Entry]
    data_entries: dict[str, _Entry]
    payload: dict[str, bytes]
    offsets: dict[str, int]
    sizes: dict[str, int]
    alignment: int
    central_at: int
    total: int

    def write_head(self, fd: int, base: int = 0) -> None:
        """Write everything but the tensor data: headers, small records, the central directory."""
        for e in self.entries:
            os.pwrite(fd, TorchZipWriter._local(e), base + e.header_offset)
            if e.name in self.payload:
                os.pwrite(fd, self.payload[e.name], base + e.data_offset)
        central = b"".join(TorchZipWriter._central(e) for e in self.entries)
        os.pwrite(fd, central + TorchZipWriter._end(self.central_at, len(central), len(self.entries)),
                  base + self.central_at)

    def head_bytes(self) -> bytes:
        """The whole archive in memory, zeros where tensor data goes (for small archives only)."""
        out = bytearray(self.total)
        for e in self.entries:
            local = TorchZipWriter._local(e)
            out[e.header_offset:e.header_offset + len(local)] = local
            if e.name in self.payload:
                out[e.data_offset:e.data_offset + e.size] = self.payload[e.name]
        central = b"".join(TorchZipWriter._central(e) for e in self.entries)
        out[self.central_at:] = central + TorchZipWriter._end(self.central_at, len(central), len(self.entries))
        return bytes(out)


def zip_layout(obj: Any, archive: str = "archive", page_offsets: Mapping[str, int] | None = None,
               path: str = "<archive>") -> ZipLayout:
    """The layout ``torch.save(obj)`` would have, with each :class:`Slot` a tensor record (see the module doc)."""
    page_offsets = page_offsets or {}
    slots = list(_slots(obj))
    refs: dict[str, _TensorReduce] = {}
    keys: dict[str, str] = {}
    for n, slot in enumerate(slots):
        if slot.sid in refs:
            raise ValueError(f"{path}: tensor id {slot.sid!r} appears twice")
        keys[slot.sid] = str(n)
        refs[slot.sid] = _TensorReduce(_StorageRef(str(n), slot.dtype, math.prod(slot.shape)), slot.shape)
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(_substitute(obj, refs))
    # the alignment is known after layout; two digits keep the record's size fixed ("64", "08")
    small = [("data.pkl", buf.getvalue()), ("byteorder", b"little"), (".storage_alignment", b"64")]
    entries: list[_Entry] = [_Entry(f"{archive}/{name}", len(data)) for name, data in small]
    sizes: dict[str, int] = {}
    for slot in slots:
        nbytes = math.prod(slot.shape) * itemsize(slot.dtype)
        sizes[slot.sid] = nbytes
        entries.append(_Entry(f"{archive}/data/{keys[slot.sid]}", nbytes))
    tail = [("version", b"3\n")]
    entries += [_Entry(f"{archive}/{name}", len(data)) for name, data in tail]
    payload = {f"{archive}/{name}": data for name, data in small + tail}

    residue = {e.name: page_offsets[slot.sid] % PAGE for slot, e in zip(slots, entries[len(small):])
               if slot.sid in page_offsets and page_offsets[slot.sid] % itemsize(slot.dtype) == 0}
    pos = 0
    for e in entries:
        e.header_offset = pos
        zip64 = e.size >= ZIP64_LIMIT or pos >= ZIP64_LIMIT
        base = 30 + len(e.name.encode()) + (20 if zip64 else 0)
        pad = (-(pos + base + 4)) % ALIGN  # the padding field itself has a 4-byte header
        if e.name in residue:
            pad = (residue[e.name] - (pos + base + 4)) % PAGE
        e.zip64, e.pad = zip64, pad
        e.data_offset = pos + 30 + len(e.name.encode()) + e.extra_len
        pos = e.data_offset + e.size
    offsets = {slot.sid: e.data_offset for slot, e in zip(slots, entries[len(small):])}
    alignment = ALIGN
    while any(off % alignment for off in offsets.values()):
        alignment //= 2
    payload[f"{archive}/.storage_alignment"] = b"%02d" % alignment
    for e in entries:
        if e.name in payload:
            e.crc = zlib.crc32(payload[e.name])
    central_size = sum(len(TorchZipWriter._central(e)) for e in entries)
    end = TorchZipWriter._end(pos, central_size, len(entries))
    return ZipLayout(entries, {slot.sid: e for slot, e in zip(slots, entries[len(small):])}, payload, offsets,
                     sizes, alignment, pos, pos + central_size + len(end))


def zip_bytes(obj: Any) -> bytes:
    """``torch.save(obj)``'s bytes for an object without tensors (a torch_dist ``common.pt``, an extra state)."""
    lay = zip_layout(obj)
    if lay.offsets:
        raise ValueError("zip_bytes writes objects without tensor slots; use TorchZipWriter")
    return lay.head_bytes()


class CrcCache:
    """CRC-32s of source ranges already read in one conversion, for ranges copied into several files.

    A tensor replicated across ranks — every expert-parallel rank's copy of the embedding
    and the attention, the last stage's copy of a tied embedding — is copied from the same
    source bytes into each rank file; each copy's CRC is then a lookup, not another read of
    the bytes (at TP2/PP2/EP4 on the 64-expert benchmark model, ~0.9 of 2.2 GB written).
    Keys are the source file's identity (device, inode) and the range, so the cache must
    not outlive the conversion that made it (the sources do not change during one). The
    newest ``limit`` entries are kept: replicas are written close together (the ranks of a
    stage in lockstep).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._crcs: collections.OrderedDict[tuple[int, int, int, int], int] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def crc(self, fd: int, offset: int, size: int) -> int:
        """CRC-32 of ``size`` bytes of ``fd`` at ``offset``, read once per conversion."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, offset, size)
        with self._lock:
            found = self._crcs.get(key)
            if found is not None:
                self._crcs.move_to_end(key)
                self.hits += 1
                return found
        value = _crc_of(fd, offset, size)  # outside the lock: the read is the slow part, and threads share it
        with self._lock:
            self._crcs[key] = value
            if len(self._crcs) > self.limit:
                self._crcs.popitem(last=False)
        return value


class TorchZipWriter:
    """One ``.pt`` file laid out at construction; tensor data arrives via :meth:`write` / :meth:`copy`.

    Every record carries its CRC-32, so tools that test the archive (``unzip -t``,
    ``zipfile.testzip``) accept it, as they accept ``torch.save``'s. File-to-file copies stay
    in the kernel (``copy_file_range``); the CRC is taken from the source range the kernel
    just read (in the page cache), per piece in whatever order the pieces arrive, and the
    pieces' CRCs are combined at :meth:`close`. ``crc=False`` leaves them 0 (what
    ``torch.serialization.set_crc32_options(False)`` writes; ``torch.load`` does not check).
    ``crc_cache`` (a :class:`CrcCache` shared by the files of one conversion) reads a source
    range copied into several files once.
    """

    def __init__(self, path: str, obj: Any, archive: str = "archive", crc: bool = True,
                 page_offsets: Mapping[str, int] | None = None, *, fd: int | None = None, base: int = 0,
                 crc_cache: CrcCache | None = None) -> None:
        self.path, self.crc, self.crc_cache = path, crc, crc_cache
        lay = zip_layout(obj, archive, page_offsets, path)
        self.sizes = lay.sizes
        self.alignment = lay.alignment
        self.offsets = {sid: base + off for sid, off in lay.offsets.items()}
        self._entries = lay.entries
        self._data_entries = lay.data_entries
        self._segments: dict[str, list[tuple[int, int, int]]] = {sid: [] for sid in self.offsets}  # (at, n, crc)
        self.total = lay.total
        self.base = base
        # an archive embedded in a larger file (a torch_dist .distcp) writes into its owner's descriptor
        self._owns_fd = fd is None
        if fd is None:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(self.fd, self.total)
        else:
            self.fd = fd
        lay.write_head(self.fd, base)
        self._central_at = base + lay.central_at

    # -- zip records --------------------------------------------------------------------------
    @staticmethod
    def _local(e: _Entry) -> bytes:
        name = e.name.encode()
        zip64 = e.size >= ZIP64_LIMIT or e.header_offset >= ZIP64_LIMIT
        size = 0xFFFFFFFF if zip64 else e.size
        return struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if zip64 else 20, 0x0800, 0, 0, 0x21, e.crc, size, size,
                           len(name), e.extra_len) + name + e.extra

    @staticmethod
    def _central(e: _Entry) -> bytes:
        name = e.name.encode()
        fields = []
        size, offset = e.size, e.header_offset
        if e.size >= ZIP64_LIMIT or e.header_offset >= ZIP64_LIMIT:
            fields = [e.size, e.size, e.header_offset]
            size, offset = 0xFFFFFFFF, 0xFFFFFFFF
        extra = struct.pack("<HH", 0x0001, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields) if fields else b""
        return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45 if fields else 20, 0x0800, 0, 0, 0x21, e.crc,
                           size, size, len(name), len(extra), 0, 0, 0, 0, offset) + name + extra

    @staticmethod
    def _end(cd_offset: int, cd_size: int, count: int) -> bytes:
        out = b""
        if cd_offset >= ZIP64_LIMIT or count >= 0xFFFF:
            eocd64 = cd_offset + cd_size
            out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_offset)
            out += struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1)
            return out + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, cd_size, 0xFFFFFFFF, 0)
        return struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, cd_size, cd_offset, 0)

    # -- data -----------------------------------------------------------------------------------
    def write(self, sid: str, byte_offset: int, data: memoryview) -> None:
        start = self.offsets[sid] + byte_offset
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], start + done)
        if self.crc and len(data):
            self._segments[sid].append((byte_offset, len(data), _crc32(data)))  # list.append is thread-safe

    def copy(self, sid: str, byte_offset: int, src_fd: int, src_offset: int, nbytes: int) -> None:
        from .blocks import copy_range

        copy_range(src_fd, src_offset, self.fd, self.offsets[sid] + byte_offset, nbytes)
        if self.crc and nbytes:
            crc = (self.crc_cache.crc if self.crc_cache is not None else _crc_of)(src_fd, src_offset, nbytes)
            self._segments[sid].append((byte_offset, nbytes, crc))

    def _record_crc(self, sid: str, e: _Entry) -> int:
        """The record's CRC from its pieces' (combined in offset order), or read back when they do not tile it."""
        pos, crc = 0, 0
        for at, n, part in sorted(self._segments[sid]):
            if at != pos or _crc32_combine is None:
                return _crc_of(self.fd, self.offsets[sid], e.size)  # a gap or overlap: the file is the truth
            crc = _crc32_combine(crc, part, n) if pos else part
            pos += n
        return crc if pos == e.size else _crc_of(self.fd, self.offsets[sid], e.size)

    def close(self) -> None:
        if self.fd < 0:
            return
        if self.crc:
            for sid, e in self._data_entries.items():
                e.crc = self._record_crc(sid, e)
            central = b"".join(self._central(e) for e in self._entries)
            os.pwrite(self.fd, central, self._central_at)
            for e in self._data_entries.values():
                os.pwrite(self.fd, struct.pack("<I", e.crc), self.base + e.header_offset + 14)
        if self._owns_fd:
            os.close(self.fd)
        self.fd = -1

    def abort(self) -> None:
        if self.fd >= 0 and self._owns_fd:
            os.close(self.fd)
        self.fd = -1


_buffers = threading.local()


def _crc_of(fd: int, offset: int, size: int) -> int:
    """CRC-32 of ``size`` bytes of ``fd`` at ``offset``, read into this thread's reusable buffer."""
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = bytearray(_CRC_CHUNK)
    view = memoryview(buf)
    crc, done = 0, 0
    while done < size:
        n = os.preadv(fd, [view[:min(len(buf), size - done)]], offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {offset + done} while computing a CRC")
        crc = _crc32(view[:n], crc)
        done += n
    return crc
