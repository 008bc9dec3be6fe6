"""safetensors files: validated headers for lazy reading, and a streaming writer.

Reading opens each file with safetensors' own ``safe_open`` (which rejects truncated or
malformed files) and takes every tensor's byte range from the header, so tensor data is
read later, per block, only where it is needed. Writing lays the header out first
(shapes are known from the plan) and then receives tensor bytes in any order.
"""

from __future__ import annotations

import math
import json
import os
import struct
from collections.abc import Iterable, Mapping

from ..dtypes import DTYPES, from_safetensors, itemsize
from .blocks import CorruptCheckpoint
from .formats import TensorInfo

__all__ = ["read_safetensors_index", "SafetensorsWriter"]

_MAX_HEADER = 100 * 1024 * 1024


def _raw_header(path: str) -> tuple[dict, int]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptCheckpoint(f"{path} is {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise CorruptCheckpoint(f"{path}: the header claims {n} bytes but the file has {size - 8} after "
                                    "the length field (truncated or not a safetensors file)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorruptCheckpoint(f"{path}: the safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpoint(f"{path}: the safetensors header is not a JSON object")
    return header, 8 + n


def read_safetensors_index(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """(key -> TensorInfo, __metadata__) of one file, after checking it is complete."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as handle:  # safetensors' own validation (no torch)
            keys = set(handle.keys())
    except Exception as exc:
        raise CorruptCheckpoint(f"{path} cannot be read as safetensors: {exc}") from None
    header, data_start = _raw_header(path)
    size = os.path.getsize(path)
    metadata = header.pop("__metadata__", None) or {}
    infos: dict[str, TensorInfo] = {}
    for key, entry in header.items():
        try:
            code, shape, (begin, end) = entry["dtype"], tuple(int(s) for s in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpoint(f"{path}: header entry for {key!r} is malformed: {entry!r}") from None
        dtype = from_safetensors(code)
        if dtype is None:
            raise CorruptCheckpoint(f"{path}: tensor {key!r} has dtype {code}, which the converter does not handle")
        if end - begin != math.prod(shape) * itemsize(dtype) or data_start + end > size:
            raise CorruptCheckpoint(f"{path}: tensor {key!r} ({code}{list(shape)}) needs bytes {begin}..{end} of "
                                    f"the data section but the file holds {size - data_start}")
        infos[key] = TensorInfo(path=path, shape=shape, dtype=dtype, offset=data_start + begin)
    if set(infos) != keys:
        raise CorruptCheckpoint(f"{path}: header keys disagree with safetensors' view of the file")
    return infos, {str(k): str(v) for k, v in metadata.items()}


class SafetensorsWriter:
    """Writes one safetensors file: header now, tensor bytes later via :meth:`write`."""

    def __init__(self, path: str, entries: Iterable[tuple[str, tuple[int, ...], str]],
                 metadata: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.offsets: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        pos = 0
        layout = []
        for key, shape, dtype in entries:
            nbytes = math.prod(shape) * itemsize(dtype)
            header[key] = {"dtype": DTYPES[dtype].safetensors, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
            layout.append((key, pos, nbytes))
            pos += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
        start = 8 + len(blob)
        for key, rel, nbytes in layout:
            self.offsets[key] = start + rel
            self.sizes[key] = nbytes
        self.total = start + pos
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, struct.pack("<Q", len(blob)) + blob, 0)
        os.ftruncate(self.fd, self.total)

    def write(self, key: str, byte_offset: int, data: memoryview) -> None:
        """``data`` at ``byte_offset`` within tensor ``key``."""
        _pwrite_all(self.fd, data, self.offsets[key] + byte_offset)

    def copy(self, key: str, byte_offset: int, src_fd: int, src_offset: int, nbytes: int) -> None:
        """``nbytes`` from another file straight into tensor ``key`` (in the kernel where it can)."""
        from .blocks import copy_range

        copy_range(src_fd, src_offset, self.fd, self.offsets[key] + byte_offset, nbytes)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
