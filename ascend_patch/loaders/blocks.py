"""Bounded-memory tensor I/O: read row ranges of stored tensors, fill output blocks from pieces.

Tensors are read with ``os.preadv`` straight into a reusable buffer (no mmap, so pages
never accumulate in the process's resident set) and written with ``os.pwrite`` at the
offsets the output file's header fixed. A block is at most ``block_bytes`` of output;
the largest tensor therefore costs one block of memory, not its size.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ..models.weightmap import Piece, TensorPlan

if TYPE_CHECKING:
    import torch

    from .formats import TensorInfo

__all__ = [
    "DTYPE_NAMES",
    "itemsize",
    "torch_dtype",
    "dtype_name",
    "CorruptCheckpoint",
    "FileCache",
    "BlockFiller",
    "row_blocks",
]

# canonical names (torch's) -> (itemsize, safetensors code)
DTYPE_NAMES: dict[str, tuple[int, str]] = {
    "float32": (4, "F32"), "bfloat16": (2, "BF16"), "float16": (2, "F16"), "float64": (8, "F64"),
    "int64": (8, "I64"), "int32": (4, "I32"), "int16": (2, "I16"), "int8": (1, "I8"), "uint8": (1, "U8"),
    "bool": (1, "BOOL"),
}
SHORT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is truncated, malformed, or not what its header says."""


def itemsize(dtype: str) -> int:
    try:
        return DTYPE_NAMES[dtype][0]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {dtype!r}") from None


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, SHORT.get(name, name))


def dtype_name(dtype: object) -> str:
    """torch.bfloat16 / "bf16" / "torch.bfloat16" -> "bfloat16"."""
    text = str(dtype).replace("torch.", "")
    return SHORT.get(text, text)


def row_blocks(rows: int, row_bytes: int, block_bytes: int) -> Iterator[tuple[int, int]]:
    """[start, stop) row ranges whose bytes stay under ``block_bytes`` (at least one row each)."""
    step = max(1, block_bytes // max(1, row_bytes))
    for start in range(0, max(rows, 1), step):
        yield start, min(max(rows, 1), start + step)


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


class BlockFiller:
    """Fills output blocks (torch tensors) from pieces of source tensors."""

    def __init__(self, tensors: Mapping[str, TensorInfo], files: FileCache | None = None) -> None:
        self.tensors = tensors
        self.files = files or FileCache()
        self.bytes_read = 0

    def read_rows(self, tid: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of source tensor ``tid`` as a fresh tensor in its own dtype."""
        import torch

        info = self.tensors[tid]
        if info.reader is not None:
            return info.reader(start, stop)
        shape = info.shape or (1,)
        out = torch.empty((stop - start, *shape[1:]), dtype=torch_dtype(info.dtype))
        self._read_into(info, start, stop, out)
        return out if info.shape else out.reshape(())

    def _read_into(self, info: TensorInfo, start: int, stop: int, out: torch.Tensor) -> None:
        shape = info.shape or (1,)
        size = itemsize(info.dtype)
        row_elems = 1
        for s in shape[1:]:
            row_elems *= s
        if info.offset is None:
            raise CorruptCheckpoint(f"{info.path}: tensor has neither a file offset nor a reader")
        fd = self.files.fd(info.path)
        if info.stride is None or _contiguous(shape, info.stride):
            view = memoryview(out.view(-1).view(_byte_dtype()).numpy()).cast("B")
            _pread_into(fd, view, info.offset + start * row_elems * size, info.path)
            self.bytes_read += len(view)
            return
        # A strided view inside a larger storage: read the span it touches, then gather.
        import torch

        stride = info.stride
        lo = start * stride[0]
        hi = lo + 1 + sum((d - 1) * s for d, s in zip((stop - start, *shape[1:]), stride))
        span = torch.empty(hi - lo, dtype=out.dtype)
        _pread_into(fd, memoryview(span.view(_byte_dtype()).numpy()).cast("B"), info.offset + lo * size, info.path)
        self.bytes_read += span.numel() * size
        out.copy_(span.as_strided((stop - start, *shape[1:]), stride))

    def fill(self, plan: TensorPlan, start: int, stop: int, out: torch.Tensor) -> None:
        """``out`` = rows [start, stop) of ``plan`` (pieces' src are keys of :attr:`tensors`)."""
        covered = 0
        for piece in plan.pieces:
            part = piece.rows(start, stop)
            if part is None:
                continue
            covered += _volume(part.size)
            self._fill_piece(part, start, out)
        expected = (stop - start) * _volume(plan.shape[1:]) if plan.shape else 1
        if covered != expected:
            raise AssertionError(f"pieces of {plan.key} cover {covered} of {expected} elements in rows "
                                 f"{start}..{stop}; the weight map is inconsistent")

    def _fill_piece(self, part: Piece, start: int, out: torch.Tensor) -> None:
        dst = out.reshape(out.shape or (1,))
        region = dst[tuple(slice(b - (start if k == 0 else 0), b - (start if k == 0 else 0) + n)
                           for k, (b, n) in enumerate(zip(part.dst_start, part.size)))]
        if part.src is None:
            region.zero_()
            return
        info = self.tensors[part.src]
        r0, n0 = part.src_start[0], part.size[0]
        full_rows = all(s == 0 and n == d for s, n, d in
                        zip(part.src_start[1:], part.size[1:], (info.shape or (1,))[1:]))
        if (full_rows and info.reader is None and info.dtype == _name(out.dtype) and region.is_contiguous()
                and (info.stride is None or _contiguous(info.shape or (1,), info.stride))):
            self._read_into(info, r0, r0 + n0, region)
            return
        rows = self.read_rows(part.src, r0, r0 + n0)
        rows = rows.reshape(rows.shape or (1,))
        sub = rows[(slice(None), *(slice(s, s + n) for s, n in zip(part.src_start[1:], part.size[1:])))]
        region.copy_(sub)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expect = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def _volume(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _byte_dtype() -> torch.dtype:
    import torch

    return torch.uint8


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
