"""Checkpoint formats as plugins: the loader / saver classes and the registry that names them.

A **loader** (:class:`CheckpointLoader`) opens a checkpoint directory and describes it
as a :class:`SourceCheckpoint`: the model (family spec, normalised config, weight map),
every physical tensor it holds (:class:`TensorInfo`: file, byte offset, shape, dtype),
and how the *canonical* tensors — the Hugging Face ones — are assembled from them.
Nothing is read beyond headers. A **saver** (:class:`CheckpointSaver`) turns a source
into a :class:`TargetPlan`: the files to write, each tensor as pieces of canonical
tensors, and the small side files (config.json, index, tracker). The engine
(:mod:`ascend_patch.loaders.engine`) streams the bytes between them.

Plugins return instances from the ``ascend_patch_checkpoint_loaders`` /
``ascend_patch_checkpoint_savers`` hooks; built-ins (``hf``, ``mg``) register the same
way. Names and aliases are unique across plugins; an unknown name lists the known ones.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..dtypes import itemsize
from ..models.weightmap import Piece, TensorPlan, WeightMap
from ..parallel import Layout

if TYPE_CHECKING:
    import torch

    from ..models.hf_config import ModelConfig
    from ..models.registry import ModelSpec
    from .preflight import Problem

__all__ = [
    "TensorInfo",
    "SourceCheckpoint",
    "TargetFile",
    "TargetPlan",
    "ConvertOptions",
    "CheckpointLoader",
    "CheckpointSaver",
    "FormatRegistry",
    "UnknownFormat",
    "get_format_registry",
    "REGISTER_HINT",
    "family_for",
]

REGISTER_HINT = ("a plugin adds one by returning a CheckpointLoader / CheckpointSaver "
                 "(ascend_patch.loaders.formats) from the ascend_patch_checkpoint_loaders / "
                 "ascend_patch_checkpoint_savers hook, registered under the entry-point group "
                 "'ascend_patch'; see docs/convert.md#writing-a-loader-plugin")


@dataclass(frozen=True)
class TensorInfo:
    """Where one physical tensor's bytes are.

    ``offset`` is the file offset of element 0 and ``stride`` its element strides
    (None = contiguous row-major). A loader whose tensors are not plain bytes in a file
    (compressed, computed) sets ``reader(start_row, stop_row) -> torch.Tensor`` instead.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name: "bfloat16", "float32", ...
    offset: int | None = None
    stride: tuple[int, ...] | None = None
    reader: Callable[[int, int], torch.Tensor] | None = field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass
class SourceCheckpoint:
    """An opened checkpoint: the model, its physical tensors, and the canonical (HF) view of them.

    ``canonical[K]`` lists pieces (``src`` = a key of ``tensors``) that together cover HF
    tensor K exactly once; ``plans`` describes each physical tensor as pieces of canonical
    tensors (identity for HF files), which verification uses; ``replicas`` are the
    redundant copies (replicated norms, the tied output layer) that must agree.
    ``inventory`` is what each file (or model chunk) holds, key -> shape (None for
    non-tensors such as ``_extra_state``), for the key-set check. ``problems`` are preflight findings (missing / unexpected tensors, ...), reported
    together with the others before any work.
    """

    format: str
    path: str
    spec: ModelSpec
    config: ModelConfig
    weight_map: WeightMap
    tensors: dict[str, TensorInfo]
    canonical: dict[str, list[Piece]]
    plans: dict[str, TensorPlan]
    dtype: str
    hf_config: dict[str, Any]
    generation_config: dict[str, Any] | None = None
    layout: Layout | None = None
    naming: str | None = None
    padded_vocab: int | None = None
    make_vocab_size_divisible_by: int | None = None
    iteration: int | str | None = None
    args: Any = None
    replicas: list[tuple[str, str, Piece]] = field(default_factory=list)
    inventory: dict[str, dict[str, tuple[int, ...] | None]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f" ({self.layout.describe_shards()}, {self.naming} naming)" if self.layout else ""
        return f"{self.format} checkpoint of a {self.config.family} model{where}, {self.dtype}"

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@dataclass
class TargetFile:
    """One output file: ``format`` is "safetensors" or "torch"; tensors are in canonical terms.

    For "torch" files ``skeleton`` is the object saved with ``torch.save`` where each
    tensor slot holds its key (a str) in ``tensor_slots``: ``{"model": [keys...]}``; the
    engine substitutes placeholders and streams the bytes in afterwards.
    """

    relpath: str
    format: str
    tensors: list[TensorPlan]
    dtype: str
    skeleton: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors) * itemsize(self.dtype)


@dataclass
class TargetPlan:
    """Everything a saver will write. ``commit`` files are written last (the tracker)."""

    files: list[TargetFile]
    side_files: dict[str, bytes] = field(default_factory=dict)
    commit_files: dict[str, bytes] = field(default_factory=dict)
    layout: Layout | None = None
    naming: str | None = None
    padded_vocab: int | None = None
    description: str = ""
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files)


@dataclass(frozen=True)
class ConvertOptions:
    """The conversion settings, whatever form the command line used."""

    target_tp: int = 1
    target_pp: int = 1
    target_vpp: int = 1
    num_layer_list: tuple[int, ...] | None = None
    make_vocab_size_divisible_by: int = 128
    params_dtype: str | None = None  # None: keep the source dtype
    naming: str = "local"  # the saver's key naming: "local" or "te"
    model_type_hf: str | None = None
    true_vocab_size: int | None = None
    max_shard_size: int = 5 * 1024**3
    iteration: int | None = None
    force: bool = False
    verify: bool = False
    progress: bool | None = None  # None: when stderr is a terminal
    workers: int = 0  # threads writing the output; 0: one per core, at most 8
    extra: Mapping[str, Any] = field(default_factory=dict)


class CheckpointLoader(abc.ABC):
    """Opens one checkpoint format. Subclass, set ``name`` (and ``aliases``), implement :meth:`open`."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    description: str = ""
    family_hints: Mapping[str, str] = {}  # alias -> model family it implies (e.g. qwen3_hf -> qwen3)

    @abc.abstractmethod
    def open(self, path: str, options: ConvertOptions) -> SourceCheckpoint:
        """Describe the checkpoint at ``path`` without reading tensor data."""

    def detect(self, path: str) -> bool:
        """Whether ``path`` looks like this format (used by ``verify`` when no loader is named)."""
        return False


class CheckpointSaver(abc.ABC):
    """Writes one checkpoint format. Subclass, set ``name`` (and ``aliases``), implement :meth:`plan`."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    description: str = ""
    loader: str = ""  # the loader that reads this format back (verification)

    @abc.abstractmethod
    def plan(self, source: SourceCheckpoint, options: ConvertOptions) -> TargetPlan:
        """The files (and their tensors in canonical terms) that represent ``source``."""


class UnknownFormat(LookupError):
    """A loader / saver name that no plugin registered."""


class FormatRegistry:
    """Loaders and savers by name and alias (case-insensitive)."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, tuple[Any, str]]] = {"loader": {}, "saver": {}}

    def add(self, kind: str, obj: Any, plugin: str = "") -> None:
        if not getattr(obj, "name", ""):
            raise ValueError(f"{kind} {obj!r} from plugin {plugin or '?'} has no name")
        table = self._items[kind]
        for name in (obj.name, *getattr(obj, "aliases", ())):
            key = name.lower()
            existing = table.get(key)
            if existing is not None and existing[0] is not obj:
                raise ValueError(f"checkpoint {kind} name {name!r} is claimed by plugin {existing[1] or '?'} "
                                 f"({existing[0].name}) and by plugin {plugin or '?'} ({obj.name})")
            table[key] = (obj, plugin)

    def _get(self, kind: str, name: str) -> Any:
        hit = self._items[kind].get(name.lower())
        if hit is None:
            raise UnknownFormat(f"unknown checkpoint {kind} {name!r}; available: {self.listing(kind)}. "
                                f"{REGISTER_HINT[0].upper()}{REGISTER_HINT[1:]}")
        return hit[0]

    def loader(self, name: str) -> CheckpointLoader:
        return self._get("loader", name)

    def saver(self, name: str) -> CheckpointSaver:
        return self._get("saver", name)

    def all(self, kind: str) -> list[Any]:
        seen: dict[int, Any] = {}
        for obj, _ in self._items[kind].values():
            seen.setdefault(id(obj), obj)
        return sorted(seen.values(), key=lambda o: o.name)

    def listing(self, kind: str) -> str:
        parts = []
        for obj in self.all(kind):
            aliases = getattr(obj, "aliases", ())
            parts.append(f"{obj.name} (aliases: {', '.join(aliases)})" if aliases else obj.name)
        return "; ".join(parts) or "none"

    def plugin_of(self, kind: str, name: str) -> str:
        hit = self._items[kind].get(name.lower())
        return hit[1] if hit else ""


_registry: FormatRegistry | None = None


def get_format_registry(refresh: bool = False) -> FormatRegistry:
    """The registry built from every plugin's loader and saver hooks."""
    global _registry
    if _registry is None or refresh:
        from ..plugins import get_plugin_manager

        registry = FormatRegistry()
        pm = get_plugin_manager()
        for plugin, loaders in pm.call_each("ascend_patch_checkpoint_loaders"):
            for obj in loaders or ():
                registry.add("loader", obj, plugin)
        for plugin, savers in pm.call_each("ascend_patch_checkpoint_savers"):
            for obj in savers or ():
                registry.add("saver", obj, plugin)
        _registry = registry
    return _registry


def family_for(name: str | None, known: Sequence[str] = ()) -> str | None:
    """``--model-type-hf`` spellings (llama2, llama3, qwen2.5, mistral, ...) -> a model spec name."""
    if not name:
        return None
    key = name.lower().replace("-", "").replace("_", "")
    table = {"llama": "llama", "llama2": "llama", "llama3": "llama", "llama31": "llama", "llama3.1": "llama",
             "llama32": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen2.5": "qwen2", "qwen25": "qwen2",
             "qwen": "qwen2", "qwen3": "qwen3"}
    return table.get(key, name)
