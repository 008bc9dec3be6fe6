"""Checkpoint formats as plugins: the loader and saver classes, what they exchange, the registry that names them."""

from __future__ import annotations

import abc
import functools
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..dtypes import itemsize
from ..models.registry import get_spec_registry
from ..models.weightmap import Piece, TensorPlan, WeightMap
from ..parallel import Layout
from ..registry import NamedRegistry, UnknownName

if TYPE_CHECKING:
    import torch

    from ..models.hf_config import ModelConfig
    from ..models.registry import ModelSpec
    from ..errors import Finding

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
]

REGISTER_HINT = ("a plugin adds one by returning a CheckpointLoader / CheckpointSaver "
                 "(ascend_patch.loaders.formats) from the ascend_patch_checkpoint_loaders / "
                 "ascend_patch_checkpoint_savers hook, registered under the entry-point group "
                 "'ascend_patch'; see docs/convert.md#writing-a-loader-plugin")


# A **loader** (:class:`CheckpointLoader`) opens a checkpoint directory and describes it
# as a :class:`SourceCheckpoint`: the model (family spec, normalised config, weight map),
# every physical tensor it holds (:class:`TensorInfo`: file, byte offset, shape, dtype),
# and how the *canonical* tensors — the Hugging Face ones — are assembled from them.
# Nothing is read beyond headers. A **saver** (:class:`CheckpointSaver`) turns a source
# into a :class:`TargetPlan`: the files to write, each tensor as pieces of canonical
# tensors, and the small side files (config.json, index, tracker). The engine
# (:mod:`ascend_patch.loaders.engine`) streams the bytes between them.
#
# Plugins return instances from the ``ascend_patch_checkpoint_loaders`` /
# ``ascend_patch_checkpoint_savers`` hooks; built-ins (``hf``, ``mg``) register the same
# way. Names and aliases are unique across plugins; an unknown name lists the known ones.
@dataclass(frozen=True, slots=True)  # slots: one per stored tensor, tens of thousands for an MoE model
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
    vocab_from: str | None = None  # how the true vocabulary of a padded source is known (--true-vocab-size, ...)
    vocab_unknown: str | None = None  # why it is not known (then config.vocab_size is the padded size)
    iteration: int | str | None = None
    args: Any = None
    replicas: list[tuple[str, str, Piece]] = field(default_factory=list)
    inventory: dict[str, dict[str, tuple[int, ...] | None]] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)
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
    problems: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files)


@dataclass(frozen=True)
class ConvertOptions:
    """The conversion settings, whatever form the command line used (every field typed: no string bag)."""

    # the target layout (read once, by loaders.target.target_layout)
    target_tp: int = 1
    target_pp: int = 1
    target_vpp: int = 1
    target_ep: int = 1  # expert-parallel ranks of an MoE model's mg output
    target_etp: int | None = None  # expert tensor-parallel size (None: TP, the only one the legacy layout holds)
    num_layer_list: tuple[int, ...] | None = None
    layers_per_virtual_stage: int | None = None  # --num-layers-per-virtual-pipeline-stage (the CLI turns it into target_vpp)
    make_vocab_size_divisible_by: int = 128
    params_dtype: str | None = None  # None: keep the source dtype
    naming: str = "local"  # the saver's key naming: "local", "te" or "te_grouped" (TE, grouped-GEMM experts)
    moe_grouped_gemm: bool = False  # --moe-grouped-gemm (checked against the naming)
    # the model
    model_type_hf: str | None = None
    family_hint: str | None = None  # the family a format name implies (--loader qwen3_hf), after --model-type-hf
    claimed: Mapping[str, bool] = field(default_factory=dict)  # --add-qkv-bias / --qk-layernorm, checked against the config
    true_vocab_size: int | None = None
    # the output
    max_shard_size: int = 5 * 1024**3
    iteration: int | None = None
    zip_crc: bool = True  # mg output: fill the zip CRC-32 fields
    force: bool = False
    verify: bool = False
    progress: bool | None = None  # None: when stderr is a terminal
    workers: int = 0  # threads writing the output; 0: one per core, at most 8
    _extra: Mapping[str, Any] = field(default_factory=dict, repr=False)  # keys of the deprecated extra= no field has

    @property
    def extra(self) -> Mapping[str, Any]:
        """Deprecated: the typed fields as the old string bag held them (for savers written against it)."""
        warnings.warn(_EXTRA_DEPRECATED, DeprecationWarning, stacklevel=2)
        defaults = {"family_hint": None, "claimed": {}, "zip_crc": True, "moe_grouped_gemm": False,
                    "layers_per_virtual_stage": None}
        bag = {k: getattr(self, k) for k, default in defaults.items() if getattr(self, k) != default}
        return MappingProxyType({**self._extra, **bag})


_EXTRA_DEPRECATED = ("ConvertOptions.extra is deprecated: its keys are typed fields now (family_hint, claimed, "
                     "zip_crc, moe_grouped_gemm, layers_per_virtual_stage); a plugin's own settings belong in a "
                     "subclass of ConvertOptions")
_typed_init = ConvertOptions.__init__


@functools.wraps(_typed_init)
def _init_with_extra(self: ConvertOptions, *args: Any, extra: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """``ConvertOptions(extra={...})``, deprecated: known keys become their typed fields."""
    if extra:
        warnings.warn(_EXTRA_DEPRECATED, DeprecationWarning, stacklevel=2)
        typed = {f.name for f in fields(ConvertOptions)} - {"_extra"}
        for key, value in extra.items():
            if key in typed:
                kwargs.setdefault(key, value)
            else:
                kwargs["_extra"] = {**kwargs.get("_extra", {}), key: value}
    _typed_init(self, *args, **kwargs)


ConvertOptions.__init__ = _init_with_extra  # type: ignore[method-assign]


class CheckpointLoader(abc.ABC):
    """Opens one checkpoint format. Subclass, set ``name`` (and ``aliases``), implement :meth:`open`."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    description: str = ""

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


class UnknownFormat(UnknownName):
    """A loader / saver name that no plugin registered."""


def _listing(names: NamedRegistry[Any]) -> str:
    parts = []
    for obj in names:
        aliases = names.names_of(obj)[1:]
        parts.append(f"{obj.name} (aliases: {', '.join(aliases)})" if aliases else obj.name)
    return "; ".join(parts) or "none"


class FormatRegistry:
    """Loaders and savers by name and alias (case-insensitive).

    Besides each format's own aliases, a model family may declare names that mean its
    HF format holding that family (``qwen3_hf``: :attr:`ModelSpec.loader_aliases`);
    :func:`get_format_registry` adds those as aliases of the format they name.
    """

    def __init__(self) -> None:
        hint = REGISTER_HINT[0].upper() + REGISTER_HINT[1:]
        self._items: dict[str, NamedRegistry[Any]] = {
            kind: NamedRegistry(f"checkpoint {kind}", hint=hint, unknown=UnknownFormat, listing=_listing)
            for kind in ("loader", "saver")}

    def add(self, kind: str, obj: Any, plugin: str = "") -> None:
        self._items[kind].add(obj, getattr(obj, "name", ""), getattr(obj, "aliases", ()), owner=plugin)

    def alias(self, kind: str, name: str, target: str, plugin: str = "") -> None:
        """Make ``name`` one more name of the ``kind`` that ``target`` names (declared by ``plugin``)."""
        self._items[kind].alias(name, target, owner=plugin)

    def loader(self, name: str) -> CheckpointLoader:
        return self._items["loader"].get(name)

    def saver(self, name: str) -> CheckpointSaver:
        return self._items["saver"].get(name)

    def find(self, kind: str, name: str) -> Any | None:
        return self._items[kind].find(name)

    def all(self, kind: str) -> list[Any]:
        return list(self._items[kind])

    def listing(self, kind: str) -> str:
        return self._items[kind].listing()

    def plugin_of(self, kind: str, name: str) -> str:
        return self._items[kind].owner_of(name)


_registry: FormatRegistry | None = None


def get_format_registry(refresh: bool = False) -> FormatRegistry:
    """The registry built from every plugin's loader and saver hooks, and the families' format aliases."""
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
        for spec in get_spec_registry(refresh=refresh).specs():
            target = spec.hf_format or "hf"
            for kind in ("loader", "saver"):
                if registry.find(kind, target) is not None:
                    for name in spec.loader_aliases:
                        registry.alias(kind, name, target, spec.owner)
        _registry = registry
    return _registry
