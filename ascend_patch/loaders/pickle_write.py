"""Protocol-2 pickles of plain data and calls of named globals, without importing the globals' modules.

torch_dist's ``.metadata`` is a pickle of torch.distributed.checkpoint's types: calls of
``torch.distributed.checkpoint.metadata.*`` and ``torch.Size`` on tuples, lists, dicts, strings
and ints. Writing it must not import torch (the import costs a conversion more than its
streaming), so the globals are named, not imported (:class:`~.torch_zip.TorchGlobal`). The
pure-Python pickler could do that but spent a large share of an MoE conversion's CPU on the
thousands of entries (a chunk per layer and expert); this writer knows only that closed set of
types and keeps no memo (nothing in it is shared or recursive), so each object costs a few
appends.
"""

from __future__ import annotations

import functools
import pickle
import struct
from typing import Any

from .torch_zip import TorchGlobal

__all__ = ["GlobalCall", "dumps"]


class GlobalCall:
    """Pickles as a call ``module.name(*args)`` (GLOBAL + REDUCE) without importing ``module``."""

    def __init__(self, module: str, name: str, *args: Any) -> None:
        self.fn, self.args = TorchGlobal(module, name), args

    def __reduce__(self) -> Any:
        return self.fn, self.args


def dumps(obj: Any) -> bytes:
    """``obj`` as a protocol-2 pickle (what ``pickle.dumps(obj, 2)`` gives, less the memo)."""
    out: list[bytes] = [pickle.PROTO + b"\x02"]
    _emit(obj, out)
    out.append(pickle.STOP)
    return b"".join(out)


@functools.lru_cache(maxsize=None)
def _global(ref: TorchGlobal) -> bytes:
    return pickle.GLOBAL + ref.module.encode() + b"\n" + ref.name.encode() + b"\n"


def _emit(obj: Any, out: list[bytes]) -> None:
    """Protocol-2 opcodes for ``obj``, appended to ``out``."""
    if isinstance(obj, GlobalCall):
        out.append(_global(obj.fn))
        _emit(obj.args, out)
        out.append(pickle.REDUCE)
    elif isinstance(obj, TorchGlobal):
        out.append(_global(obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        out.append(pickle.BINUNICODE + struct.pack("<I", len(data)) + data)
    elif obj is None:
        out.append(pickle.NONE)
    elif isinstance(obj, bool):
        out.append(pickle.NEWTRUE if obj else pickle.NEWFALSE)
    elif isinstance(obj, int):
        if 0 <= obj < 256:
            out.append(pickle.BININT1 + bytes((obj,)))
        elif 0 <= obj < 65536:
            out.append(pickle.BININT2 + struct.pack("<H", obj))
        elif -0x80000000 <= obj <= 0x7FFFFFFF:
            out.append(pickle.BININT + struct.pack("<i", obj))
        else:
            data = pickle.encode_long(obj)
            out.append(pickle.LONG1 + bytes((len(data),)) + data)
    elif isinstance(obj, tuple):
        if not obj:
            out.append(pickle.EMPTY_TUPLE)
            return
        out.append(pickle.MARK)
        for item in obj:
            _emit(item, out)
        out.append(pickle.TUPLE)
    elif isinstance(obj, list):
        out.append(pickle.EMPTY_LIST)
        if obj:
            out.append(pickle.MARK)
            for item in obj:
                _emit(item, out)
            out.append(pickle.APPENDS)
    elif isinstance(obj, dict):
        out.append(pickle.EMPTY_DICT)
        if obj:
            out.append(pickle.MARK)
            for key, value in obj.items():
                _emit(key, out)
                _emit(value, out)
            out.append(pickle.SETITEMS)
    else:
        raise TypeError(f"pickle_write has no encoding for {type(obj).__name__}")
