"""Reading the pickles of a torch_dist checkpoint without importing torch.

``import torch`` costs a process ~280 MB resident and 1.3-2 s of CPU on this project's
machines, ``torch.distributed.checkpoint`` another ~50 MB and ~0.4 s: more than streaming
a 1 GB checkpoint, and 24 % of one. A torch_dist -> HF conversion needs three kinds of
pickle, all small and all of known shape, so it reads them here with inert stand-ins:

- ``.metadata``: torch.distributed.checkpoint's ``Metadata``. Every class of that package
  becomes a :class:`DcpRecord` that keeps the fields the pickle gives (``BUILD`` state for a
  file torch wrote, constructor arguments for one :func:`~.torch_dist_io.dumps_metadata`
  wrote, mapped through the dataclasses' field order in :data:`DCP_FIELDS`, which a test
  checks against torch's own classes). Attribute access is what torch's objects offer.
- ``common.pt``: Megatron's ``args`` and the iteration. Read like ``torch_io.safe_load``
  reads it, with the same allowlist and Megatron stand-ins; torch's dtypes become
  :class:`TorchName` (``str()`` is ``"torch.bfloat16"`` and it pickles back as that global).
- each chunk of a ``.distcp``: one ``torch.save`` archive of a tensor, whose pickle is a
  ``_rebuild_tensor_v2`` call on a storage; read into :class:`TensorRef`.

Nothing is constructed but these stand-ins, plain containers and the allowlisted types.
What the readers do not recognise raises :class:`NeedsTorch`, and the caller falls back
to torch's own loader (which refuses a hostile pickle as before): the fast path is a
subset of what torch accepts, never a superset.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
from dataclasses import dataclass
from typing import Any

from ..dtypes import DTYPES
from ..errors import AscendPatchError
from .torch_zip import TorchGlobal

__all__ = [
    "DCP_FIELDS",
    "DcpRecord",
    "MEGATRON_PLANS",
    "NeedsTorch",
    "RefusedGlobal",
    "StorageRef",
    "TensorRef",
    "TorchName",
    "load_metadata",
    "load_plain",
    "load_tensor",
]


class NeedsTorch(AscendPatchError):
    """The pickle names something the torch-free readers do not model; read it with torch instead.

    Internal: the readers' callers catch it and fall back to torch's loader.
    """


class RefusedGlobal(AscendPatchError, pickle.UnpicklingError):
    """A ``.metadata`` pickle names a global no checkpoint metadata holds (``module.name``); nothing was run."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class TorchName(TorchGlobal):
    """A torch value named by a global (``torch.bfloat16``, ``torch.strided``), without torch.

    ``str()`` gives torch's spelling, so :func:`ascend_patch.dtypes.canonical` reads it as
    it reads a ``torch.dtype``; pickled by :mod:`.torch_zip` it is the same global again.
    """

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return str(self)


# torch.distributed.checkpoint's dataclasses, their fields in constructor order (torch 2.13);
# tests/loaders/test_torch_pickle.py compares this with dataclasses.fields() of torch's classes
DCP_FIELDS: dict[str, tuple[str, ...]] = {
    "Metadata": ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"),
    "TensorStorageMetadata": ("properties", "size", "chunks"),
    "ChunkStorageMetadata": ("offsets", "sizes"),
    "TensorProperties": ("dtype", "layout", "requires_grad", "memory_format", "pin_memory"),
    "BytesStorageMetadata": (),
    "MetadataIndex": ("fqn", "offset", "index"),
    "StorageMeta": ("checkpoint_id", "save_id", "load_id", "modules"),
    "_StorageInfo": ("relative_path", "offset", "length", "transform_descriptors"),
}
_DCP_PREFIX = "torch.distributed.checkpoint."
# the other classes of torch.distributed.checkpoint a .metadata names (the planner's, when torch saves its plans);
# any other name is read by torch itself, which knows whether it exists
_DCP_OTHER = {"_MEM_FORMAT_ENCODING", "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"}
# megatron-core's SavePlan subclass (a SavePlan with mcore_data): the planner of the older supported releases makes
# its plans of this class, and torch keeps every rank's plan in the metadata (all_local_plans); read as a record,
# never imported
MEGATRON_PLANS = {("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan")}


class DcpRecord:
    """A stand-in for one of torch.distributed.checkpoint's objects: its fields as attributes.

    Fields a pickle leaves out read as None (the dataclasses' defaults that matter here:
    ``MetadataIndex.offset`` / ``index``, ``_StorageInfo.transform_descriptors``).
    """

    cls: str = ""
    fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self.fields) and self.fields:
            raise NeedsTorch(f"{self.cls} called with {len(args)} arguments; it has {len(self.fields)} fields")
        self.args = args
        self.__dict__.update(zip(self.fields, args))
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            for part in state:  # (__dict__, __slots__ values)
                self.__dict__.update(part or {})
        elif isinstance(state, dict):
            self.__dict__.update(state)
        elif isinstance(state, tuple) and len(state) == len(self.fields):  # TensorProperties.__getstate__
            self.__dict__.update(zip(self.fields, state))
        else:
            raise NeedsTorch(f"{self.cls}: unexpected pickled state {type(state).__name__}")

    def __getattr__(self, name: str) -> Any:
        if name in type(self).fields or name in ("offset", "index", "transform_descriptors"):
            return None
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.__dict__.items() if k != "args"}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


_RECORDS: dict[str, type[DcpRecord]] = {}


def _record(module: str, name: str) -> type[DcpRecord]:
    path = f"{module}.{name}"
    if path not in _RECORDS:
        _RECORDS[path] = type(name, (DcpRecord,), {"cls": path, "fields": DCP_FIELDS.get(name, ()),
                                                   "__module__": __name__})
    return _RECORDS[path]


def _size(dims: Any = ()) -> tuple[int, ...]:  # torch.Size(dims)
    return tuple(int(d) for d in dims)


def _get_layout(name: str) -> TorchName:  # torch.serialization._get_layout("torch.strided")
    return TorchName("torch", str(name).rsplit(".", 1)[-1])


def _device(*args: Any) -> TorchName:
    return TorchName("torch", f"device({', '.join(map(repr, args))})")


# torch values named in these pickles besides the dtypes
_TORCH_VALUES = {"strided", "sparse_coo", "contiguous_format", "preserve_format", "channels_last",
                 "channels_last_3d"}
# every torch.dtype's name (torch 2.13: float8_e4m3fn, uint16, complex64, qint8, bits8, ...), so a checkpoint of a
# dtype the converter does not handle reads, and the converter then names that dtype (as with torch's own reader)
_DTYPE_NAME = re.compile(r"(u?int\d+|float\d+(_[a-z0-9]+)*|bfloat16|complex\d+|bool|bits\w+|qu?int\w+|bit|half|float|"
                         r"double|cfloat|cdouble|chalf|long|int|short)\Z")
_STORAGES = {d.storage: name for name, d in DTYPES.items()}


def _torch_global(name: str) -> Any:
    if name == "Size":
        return _size
    if name == "device":
        return _device
    if name in DTYPES or name in _TORCH_VALUES or _DTYPE_NAME.match(name):
        return TorchName("torch", name)
    if name in _STORAGES:
        return TorchName("torch", name)
    raise NeedsTorch(f"torch.{name}")


class _MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's types as records, torch.Size as tuples, dtypes as names, paths."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_DCP_PREFIX):
            if name not in DCP_FIELDS and name not in _DCP_OTHER:
                raise NeedsTorch(f"{module}.{name}")
            return _record(module, name)
        if (module, name) in MEGATRON_PLANS:
            return _record(module, name)
        if module == "torch.serialization" and name == "_get_layout":
            return _get_layout
        if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            return super().find_class(module, name)  # StorageMeta.checkpoint_id as a path
        if module == "torch":
            try:
                return _torch_global(name)
            except NeedsTorch:
                pass
        raise RefusedGlobal(f"{module}.{name}")


def load_metadata(data: bytes) -> Any:
    """The ``.metadata`` pickle ``data`` with :class:`DcpRecord` stand-ins (raises :class:`RefusedGlobal` for a
    global outside torch.distributed.checkpoint, torch.Size, dtypes and paths, :class:`NeedsTorch` for a class
    of torch.distributed.checkpoint it does not know)."""
    return _MetadataUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class StorageRef:
    """A storage of a ``torch.save`` pickle: its record key, dtype and element count."""

    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a ``torch.save`` pickle: its storage and the view of it."""

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.storage.dtype


def _rebuild_tensor_v2(storage: Any, storage_offset: int, size: Any, stride: Any, *rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise NeedsTorch("a tensor whose storage is not a plain storage")
    return TensorRef(storage, int(storage_offset), _size(size), _size(stride))


class _TorchSaveUnpickler(pickle.Unpickler):
    """A ``torch.save`` archive's ``data.pkl``: tensors as :class:`TensorRef`, ``allowed`` globals as themselves."""

    def __init__(self, file: Any, allowed: dict[str, Any], stand_in: Any = None) -> None:
        super().__init__(file)
        self.allowed, self.stand_in = allowed, stand_in
        self.storages = 0

    def find_class(self, module: str, name: str) -> Any:
        path = f"{module}.{name}"
        if path in self.allowed:
            return self.allowed[path]
        if module == "torch":
            return _torch_global(name)
        if path == "torch._utils._rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if path == "torch.serialization._get_layout":
            return _get_layout
        if self.stand_in is not None and module.startswith("megatron."):
            return self.stand_in(path)
        raise NeedsTorch(path)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], TorchName)
                and pid[1].name in _STORAGES and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise NeedsTorch(f"persistent id {pid!r}")
        self.storages += 1
        return StorageRef(pid[2], _STORAGES[pid[1].name], pid[4])


# the plain globals torch's weights-only unpickler allows in every file (a subset of its list)
_PLAIN = {"collections.OrderedDict": collections.OrderedDict, "builtins.set": set, "builtins.frozenset": frozenset,
          "builtins.bytearray": bytearray, "builtins.complex": complex, "_codecs.encode": __import__("_codecs").encode}


def load_plain(data: bytes, allowed: dict[str, Any], stand_in: Any) -> Any:
    """A ``data.pkl`` holding no tensor (``common.pt``): ``allowed`` globals, Megatron ``stand_in`` classes,
    torch's dtypes as :class:`TorchName`. Raises :class:`NeedsTorch` for anything else, a tensor included."""
    unpickler = _TorchSaveUnpickler(io.BytesIO(data), {**_PLAIN, **allowed}, stand_in)
    obj = unpickler.load()
    if unpickler.storages:
        raise NeedsTorch("the file holds tensors")
    return obj


def load_tensor(data: bytes) -> TensorRef:
    """The tensor a ``torch.save(tensor)`` archive's ``data.pkl`` describes (raises :class:`NeedsTorch` for any
    other content)."""
    obj = _TorchSaveUnpickler(io.BytesIO(data), {"collections.OrderedDict": collections.OrderedDict}).load()
    if not isinstance(obj, TensorRef):
        raise NeedsTorch(f"a {type(obj).__name__}, not a tensor")
    return obj
