"""``.pt`` files without running their code, and a streaming ``torch.save``-format writer.

Reading: ``torch.load(weights_only=True)`` with an explicit allowlist — argparse.Namespace
(Megatron's ``args``) and the few plain containers Megatron-LM pickles, numpy's array
reconstruction (``rng_state``), and inert *stand-ins* for Megatron's own types (enums,
OptimizerConfig, ...), which keep the data without importing or running Megatron. Any
other global (``os.system`` in a hostile pickle) is refused before anything is called.
Tensors load on the meta device, so only the pickle is read; each tensor's file offset
comes from torch itself (``storage._checkpoint_offset``) and its bytes are read later,
per block.

Writing without torch is :mod:`.torch_zip`.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from ..dtypes import canonical, itemsize
from ..errors import AscendPatchError
from .blocks import CorruptCheckpoint
from .formats import TensorInfo

__all__ = [
    "UnsafeCheckpoint",
    "MegatronObject",
    "STAND_IN_PREFIXES",
    "check_archive",
    "safe_load",
    "tensor_infos",
]

# Globals under these prefixes (Megatron's enums, OptimizerConfig, RerunState, ... in ``args`` and
# the rerun state) get inert stand-ins: their data is kept, their code is never imported or run.
STAND_IN_PREFIXES = ("megatron.",)
_ANY_GLOBAL = re.compile(r"GLOBAL ([\w.]+)|unrecognized function ([^\s]+)")


class UnsafeCheckpoint(AscendPatchError, ValueError):
    """A pickle that needs a global outside the allowlist (nothing from it was executed)."""


class MegatronObject:
    """A stand-in for a Megatron object in a pickle (an enum member, a config dataclass).

    Records what the pickle said — ``cls`` (the class path), ``args`` (constructor
    arguments; an enum's value) and ``state`` (attributes) — without importing or running
    Megatron.
    """

    cls: str = ""

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.state: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        self.state = dict(state) if isinstance(state, dict) else {"state": state}

    @property
    def value(self) -> Any:
        return self.args[0] if len(self.args) == 1 else self.args

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__.get("state") or {}
        if name in state:
            return state[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        inside = repr(self.value) if self.args else ", ".join(f"{k}={v!r}" for k, v in self.state.items())
        return f"{self.cls.rsplit('.', 1)[-1]}({inside})"


def _stand_in(path: str) -> type:
    return type(path.rsplit(".", 1)[-1], (MegatronObject,), {"cls": path, "__module__": __name__})


def _base_allowlist() -> list[Any]:
    import io
    import pathlib
    import signal
    import types

    # Megatron-LM checkpoints carry these plain containers (megatron.core.safe_globals lists them too).
    allowed: list[Any] = [argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath, io.BytesIO, signal.Signals,
                          bytes]  # protocol-2 pickles spell an empty bytes object as a call to bytes()
    try:  # numpy arrays appear in Megatron's rng_state
        import numpy as np

        allowed += [np.ndarray, np.dtype]
        for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
            allowed.append((np._core.multiarray._reconstruct if hasattr(np, "_core")
                            else np.core.multiarray._reconstruct, f"{mod}._reconstruct"))
        for name in dir(np.dtypes):
            cls = getattr(np.dtypes, name)
            if isinstance(cls, type) and issubclass(cls, np.dtype):
                allowed.append((cls, f"numpy.dtypes.{name}"))
    except ImportError:  # pragma: no cover - numpy is a torch dependency here
        pass
    return allowed


_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_PICKLE_OPCODES = {ord(op.code) for op in __import__("pickletools").opcodes}
_LEGACY_MAGIC = b"\x80\x02"  # torch < 1.6 wrote a bare protocol-2 pickle


def check_archive(path: str) -> list[tuple[int, int]] | None:
    """Check a torch file's zip structure without reading tensor data; the (start, size) of its data records.

    Reads the central directory and every local header: each record must be stored
    (torch never compresses), lie inside the file before the directory and carry the name
    the directory gives it, and the archive must hold one ``data.pkl``. A legacy (non-zip)
    torch file returns None. Raises :class:`CorruptCheckpoint` naming the file and the fault.
    """
    import zipfile

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4)
        if not head.startswith(b"PK"):
            if head.startswith(_LEGACY_MAGIC):
                return None
            raise CorruptCheckpoint(f"{path} ({size} bytes) is not a torch checkpoint: it is neither a zip archive "
                                    "(torch >= 1.6) nor a legacy torch pickle (truncated at the start or overwritten)")
        try:
            with zipfile.ZipFile(f) as zf:
                infos, directory = zf.infolist(), zf.start_dir
        except Exception as exc:  # a damaged directory raises BadZipFile, struct.error, ValueError, ...
            raise CorruptCheckpoint(f"{path} ({size} bytes): the zip directory cannot be read ({exc}); the file is "
                                    "truncated or damaged") from None
        pickles = [i.filename for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if len(pickles) != 1:
            raise CorruptCheckpoint(f"{path}: the archive holds {len(pickles)} data.pkl records, a torch checkpoint "
                                    "holds one (damaged, or not written by torch.save)")
        records = []
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                raise CorruptCheckpoint(f"{path}: record {info.filename} is compressed; torch.save stores every "
                                        "record uncompressed (damaged, or re-zipped by another tool)")
            f.seek(info.header_offset)
            local = f.read(_LOCAL_HEADER.size)
            if len(local) < _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(local)[0] != 0x04034B50:
                raise CorruptCheckpoint(f"{path}: record {info.filename} has no local header at byte "
                                        f"{info.header_offset} (damaged)")
            name_len, extra_len = _LOCAL_HEADER.unpack(local)[-2:]
            if f.read(name_len) != info.filename.encode():
                raise CorruptCheckpoint(f"{path}: the local header at byte {info.header_offset} does not name "
                                        f"{info.filename} (damaged)")
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            if start + info.file_size > directory:
                raise CorruptCheckpoint(f"{path}: record {info.filename} needs bytes {start}..{start + info.file_size}"
                                        f" but the data ends at {directory} (truncated or damaged)")
            if "/data/" in info.filename:
                records.append((start, info.file_size))
    return sorted(records)


def safe_load(path: str, *, meta: bool = True) -> Any:
    """The object in ``path`` with tensors on the meta device (or in memory when ``meta=False``).

    torch lists the globals a checkpoint's pickle names before anything is unpickled
    (``get_unsafe_globals_in_checkpoint``, a static read of the pickle): Megatron's own
    classes get stand-ins, any other global outside the allowlist refuses the file.
    """
    import torch
    from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

    if not os.path.isfile(path):
        raise CorruptCheckpoint(f"{path} does not exist")
    check_archive(path)
    allowed = _base_allowlist()
    with safe_globals(allowed):
        try:
            unsafe = sorted(get_unsafe_globals_in_checkpoint(path))
        except ValueError:  # not a zip checkpoint (torch < 1.6 wrote pickles directly): nothing to scan
            unsafe = []
        except Exception as exc:
            raise _corrupt(path, exc) from None
    refused = [name for name in unsafe if not name.startswith(STAND_IN_PREFIXES)]
    if refused:
        raise _unsafe(path, ", ".join(refused))
    stand_ins = [(_stand_in(name), name) for name in unsafe]
    try:
        with safe_globals(allowed + stand_ins):
            return torch.load(path, map_location="meta" if meta else "cpu", weights_only=True)
    except Exception as exc:
        text = str(exc)
        # what a static read cannot see (a global pushed by other opcodes) is still refused by the unpickler
        named = _ANY_GLOBAL.search(text)
        operand = re.search(r"Unsupported operand (\d+)", text)
        if operand and int(operand.group(1)) not in _PICKLE_OPCODES:  # not an opcode at all: damaged bytes
            raise _corrupt(path, ValueError(f"byte {operand.group(1)} where the pickle needs an opcode")) from None
        if named or operand or "is blocked" in text:
            raise _unsafe(path, (named.group(1) or named.group(2)) if named else "an object constructor") from None
        # whatever else the unpickler raises on these bytes (KeyError for a storage key the archive lacks,
        # TypeError for a rebuild given the wrong arguments, ...) is a file it cannot read, not a bug here
        raise _corrupt(path, exc) from None


def _unsafe(path: str, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"{path}: refusing to unpickle {what}, which is not on the allowlist of a weights-only "
                            "checkpoint; nothing from the file was executed. Do not load it with "
                            "torch.load(weights_only=False) (that would run it): take the checkpoint from a source "
                            "you trust, or re-save its tensors where it was written.")


def _corrupt(path: str, exc: BaseException) -> CorruptCheckpoint:
    text = str(exc)
    return CorruptCheckpoint(f"{path} ({os.path.getsize(path)} bytes) cannot be read as a torch checkpoint: "
                             f"{text.splitlines()[0] if text else type(exc).__name__} (truncated or corrupt?)")


def tensor_infos(obj: Mapping[str, Any], path: str) -> Iterator[tuple[str, TensorInfo | None]]:
    """(key, TensorInfo) for every entry of a state dict loaded by :func:`safe_load` (None for non-tensors)."""
    import bisect

    import torch

    size = os.path.getsize(path)
    records = check_archive(path)
    starts = [r[0] for r in records or ()]
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            yield key, None
            continue
        storage = value.untyped_storage()
        base = getattr(storage, "_checkpoint_offset", None)
        if base is None:
            raise CorruptCheckpoint(f"{path}: tensor {key!r} has no recorded file offset")
        dtype = canonical(value.dtype)
        offset = base + value.storage_offset() * itemsize(dtype)
        shape = tuple(value.shape)
        stride = tuple(value.stride())
        info = TensorInfo(path=path, shape=shape, dtype=dtype, offset=offset,
                          stride=None if value.is_contiguous() else stride)
        extent = offset + (1 + sum((d - 1) * s for d, s in zip(shape, stride))) * itemsize(dtype) if all(shape) else offset
        if extent > size:
            raise CorruptCheckpoint(f"{path}: tensor {key!r} needs bytes up to {extent} but the file has {size} "
                                    "(truncated)")
        if records and all(shape):  # its bytes must lie in one data record: a damaged pickle points elsewhere
            at = bisect.bisect_right(starts, offset) - 1
            if at < 0 or extent > records[at][0] + records[at][1]:
                raise CorruptCheckpoint(f"{path}: tensor {key!r} ({dtype}{list(shape)}) needs bytes {offset}..{extent}"
                                        ", which no data record of the archive holds (damaged)")
        yield key, info
