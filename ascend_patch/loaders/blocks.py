"""Bounded-memory tensor I/O on raw bytes: no torch unless a dtype must change."""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import itemsize, torch_dtype
from ..errors import AscendPatchError
from ..models.weightmap import Piece, TensorPlan, WeightMapError

if TYPE_CHECKING:
    from .formats import TensorInfo

__all__ = [
    "contiguous",
    "raw_dtype",
    "to_raw",
    "raw_to_torch",
    "cast_raw",
    "CorruptCheckpoint",
    "FileCache",
    "BlockFiller",
    "row_blocks",
    "copy_range",
    "copy_through",
]

# Tensors are handled as numpy arrays of same-width unsigned integers ("raw" views: a
# bf16 tensor is a uint16 array), which is all that moving, slicing and padding need and
# keeps equality bitwise. A piece whose source and destination are both whole contiguous
# rows in the same dtype is copied file to file (``os.copy_file_range``: the bytes never
# enter this process). Everything else is assembled in a block of at most ``block_bytes``
# read with ``os.preadv`` (no mmap, so pages never accumulate in the resident set) and
# written with ``os.pwrite``. Casting (fp32 -> bf16, ...) is the only step that imports torch.
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class CorruptCheckpoint(AscendPatchError, ValueError):
    """A checkpoint file that is truncated, malformed, or not what its header says."""


def raw_dtype(dtype: str) -> Any:
    """The unsigned integer numpy dtype of the same width (bf16 -> uint16)."""
    return _RAW[itemsize(dtype)]


def to_raw(value: Any, dtype: str) -> np.ndarray:
    """A torch tensor or numpy array (of ``dtype``) as its raw unsigned-integer view."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).view(raw_dtype(dtype))
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
    return value.contiguous().view(width).numpy().view(raw_dtype(dtype))


def raw_to_torch(raw: np.ndarray, dtype: str) -> Any:
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize(dtype)]
    signed = raw.view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[itemsize(dtype)])
    return torch.from_numpy(np.ascontiguousarray(signed)).view(width).view(torch_dtype(dtype))


def cast_raw(raw: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Values of ``src`` dtype cast to ``dst`` (torch's rounding), as raw views."""
    if src == dst:
        return raw
    return to_raw(raw_to_torch(raw, src).to(torch_dtype(dst)), dst)


def row_blocks(rows: int, row_bytes: int, block_bytes: int) -> Iterator[tuple[int, int]]:
    """[start, stop) row ranges whose bytes stay under ``block_bytes`` (at least one row each)."""
    step = max(1, block_bytes // max(1, row_bytes))
    for start in range(0, max(rows, 1), step):
        yield start, min(max(rows, 1), start + step)


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, nbytes: int) -> None:
    """File-to-file copy in the kernel; falls back to pread/pwrite where the kernel cannot."""
    done = 0
    try:
        while done < nbytes:
            n = os.copy_file_range(src_fd, dst_fd, nbytes - done, src_offset + done, dst_offset + done)
            if n == 0:
                raise CorruptCheckpoint(f"source ended {nbytes - done} bytes early (truncated file)")
            done += n
        return
    except OSError as exc:
        if exc.errno not in (18, 22, 38, 95):  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP
            raise

    def sink(off: int, mv: memoryview) -> None:
        w = 0
        while w < len(mv):
            w += os.pwrite(dst_fd, mv[w:], dst_offset + off + w)

    copy_through(src_fd, src_offset + done, nbytes - done, lambda off, mv: sink(done + off, mv))


def copy_through(src_fd: int, src_offset: int, nbytes: int, sink: Callable[[int, memoryview], None],
                 chunk: int = 16 * 1024 * 1024) -> None:
    """Read ``nbytes`` at ``src_offset`` in chunks and hand each to ``sink(offset_within, data)``."""
    buf = bytearray(min(chunk, max(nbytes, 1)))
    view = memoryview(buf)
    done = 0
    while done < nbytes:
        n = min(len(buf), nbytes - done)
        _pread_into(src_fd, view[:n], src_offset + done, "<source>")
        sink(done, view[:n])
        done += n


class FileCache:
    """A few open read-only file descriptors, least recently used closed first."""

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()

    def fd(self, path: str) -> int:
        fd = self._fds.pop(path, None)
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            while len(self._fds) >= self.limit:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[path] = fd
        return fd

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


def _pread_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise CorruptCheckpoint(f"{path} ended at byte {offset + got}; {len(view) - got} more bytes of "
                                    "tensor data were expected (the file is truncated)")
        got += n


def contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expect = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


class BlockFiller:
    """Fills output blocks (raw numpy arrays) from pieces of source tensors."""

    def __init__(self, tensors: Mapping[str, TensorInfo], files: FileCache | None = None) -> None:
        self.tensors = tensors
        self.files = files or FileCache()
        # Source rows that another fill of the current block will read again (see expect): TP ranks written
        # in lockstep read a row-parallel weight's rows in turn, which are read once for all of them. An
        # entry goes when its last reader took it, so nothing outlives the block.
        self._kept: dict[tuple[str, int, int], np.ndarray] = {}
        self._wanted: dict[tuple[str, int, int], int] = {}

    def expect(self, plans: list[TensorPlan], start: int, stop: int) -> None:
        """Rows [start, stop) of each of ``plans`` are filled next: a source range more than one of them reads
        is kept between those reads (and no longer); anything kept for an earlier block is dropped."""
        wanted: dict[tuple[str, int, int], int] = {}
        for plan in plans:
            for piece in plan.pieces:
                part = piece.rows(start, stop)
                if part is not None and part.src is not None:
                    key = (part.src, part.src_start[0], part.src_start[0] + part.size[0])
                    wanted[key] = wanted.get(key, 0) + 1
        self._wanted = {k: n for k, n in wanted.items() if n > 1}
        self._kept.clear()

    def _plain(self, info: TensorInfo) -> bool:
        return info.reader is None and info.offset is not None and (
            info.stride is None or contiguous(info.shape or (1,), info.stride))

    def read_rows(self, tid: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of source tensor ``tid``, raw, in its own dtype (callers must not modify it)."""
        key = (tid, start, stop)
        left = self._wanted.get(key, 0)
        if left:
            self._wanted[key] = left - 1
        rows = self._kept.pop(key, None) if left <= 1 else self._kept.get(key)
        if rows is None:
            rows = self._read_rows(tid, start, stop)
            if left > 1:
                self._kept[key] = rows
        return rows

    def _read_rows(self, tid: str, start: int, stop: int) -> np.ndarray:
        info = self.tensors[tid]
        shape = info.shape or (1,)
        if info.reader is not None:
            return to_raw(info.reader(start, stop), info.dtype).reshape(stop - start, *shape[1:])
        if info.offset is None:
            raise CorruptCheckpoint(f"{info.path}: tensor has neither a file offset nor a reader")
        out = np.empty((stop - start, *shape[1:]), dtype=raw_dtype(info.dtype))
        size = itemsize(info.dtype)
        fd = self.files.fd(info.path)
        if self._plain(info):
            row = math.prod(shape[1:]) * size
            _pread_into(fd, memoryview(out.reshape(-1).view(np.uint8)), info.offset + start * row, info.path)
            return out
        # A strided view inside a larger storage: read the span it touches, then gather.
        stride = info.stride or ()
        lo = start * stride[0]
        hi = lo + 1 + sum((d - 1) * s for d, s in zip((stop - start, *shape[1:]), stride))
        span = np.empty(hi - lo, dtype=raw_dtype(info.dtype))
        _pread_into(fd, memoryview(span.view(np.uint8)), info.offset + lo * size, info.path)
        view = np.lib.stride_tricks.as_strided(span, (stop - start, *shape[1:]), tuple(s * size for s in stride))
        out[...] = view
        return out

    def direct(self, plan: TensorPlan, dtype: str) -> list[tuple[Piece, TensorInfo | None]] | None:
        """The plan's pieces when every one can be copied file to file (whole rows, same dtype), else None."""
        rest = tuple(plan.shape[1:])
        out = []
        for p in plan.pieces:
            if tuple(p.size[1:]) != rest:
                return None
            if p.src is None:
                out.append((p, None))
                continue
            info = self.tensors[p.src]
            if (info.dtype != dtype or not self._plain(info) or tuple((info.shape or (1,))[1:]) != rest
                    or any(p.src_start[1:])):
                return None
            out.append((p, info))
        return out

    def fill(self, plan: TensorPlan, start: int, stop: int, out: np.ndarray, dtype: str) -> None:
        """``out`` (raw, ``dtype``) = rows [start, stop) of ``plan``; pieces' src are keys of :attr:`tensors`."""
        covered = 0
        for piece in plan.pieces:
            part = piece.rows(start, stop)
            if part is None:
                continue
            covered += math.prod(part.size)
            region = out[tuple(slice(b - (start if k == 0 else 0), b - (start if k == 0 else 0) + n)
                               for k, (b, n) in enumerate(zip(part.dst_start, part.size)))]
            if part.src is None:
                region[...] = 0
                continue
            info = self.tensors[part.src]
            r0, n0 = part.src_start[0], part.size[0]
            rows = self.read_rows(part.src, r0, r0 + n0)
            sub = rows[(slice(None), *(slice(s, s + n) for s, n in zip(part.src_start[1:], part.size[1:])))]
            region[...] = sub if info.dtype == dtype else cast_raw(np.ascontiguousarray(sub), info.dtype, dtype)
        expected = (stop - start) * math.prod(plan.shape[1:])
        if covered != expected:
            raise WeightMapError(f"pieces of {plan.key} cover {covered} of {expected} elements in rows {start}..{stop}: "
                                 "the weight map is inconsistent", "coverage", "fix the family's weights.py (its rules "
                                 "must cover every element of each tensor exactly once)")
