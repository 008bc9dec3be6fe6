"""The one parallel :class:`Layout`: who holds which TP / CP / EP / DP / PP coordinate, and which layers.

Rank order (megatron-core ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``): the
dimensions are listed fastest-varying first, so with sizes ``s_0, s_1, ...`` in that
order a rank is ``c_0 + s_0 * (c_1 + s_1 * (c_2 + ...))``. Two layouts share the world:

* the dense (attention) layout uses TP, CP, DP, PP (EP is 1 there);
* the expert (MoE) layout uses expert-TP (default TP), EP, expert-DP, PP (CP is 1 there),
  expert-DP = world / (expert-TP x EP x PP).

A group for a set of dimensions ("dp-cp", "tp-pp", ...) is every set of ranks that
agree on all the other dimensions; groups and their members are listed in ascending
rank order, as megatron-core builds them.

With ``layer_counts`` (one count per model chunk, virtual-stage-major: (v=0, p=0),
(v=0, p=1), ..., (v=1, p=0), ...) the layout also places the layers, which is what a
checkpoint's shards need: :meth:`Layout.build` makes one from a layer count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from .placement import check_layers
from .sizes import CONVERT_FLAGS, TRAINING_FLAGS, ParallelConfigError, ParallelFlags, check_sizes, check_world_size

__all__ = ["DEFAULT_ORDER", "DIMENSIONS", "MEGATRON_GROUPS", "Layout", "LayoutError", "RankRow", "parse_order"]

DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"

# megatron-core parallel_state group -> (layout, dimensions); "expert" groups use the MoE layout
MEGATRON_GROUPS: dict[str, tuple[str, str]] = {
    "tensor_model_parallel": ("dense", "tp"),
    "pipeline_model_parallel": ("dense", "pp"),
    "data_parallel": ("dense", "dp"),
    "data_parallel_with_cp": ("dense", "dp-cp"),
    "context_parallel": ("dense", "cp"),
    "model_parallel": ("dense", "tp-pp"),
    "tensor_and_context_parallel": ("dense", "tp-cp"),
    "tensor_and_data_parallel": ("dense", "tp-dp"),
    "tensor_and_data_parallel_with_cp": ("dense", "tp-dp-cp"),
    "expert_model_parallel": ("expert", "ep"),
    "expert_tensor_parallel": ("expert", "tp"),
    "expert_tensor_and_model_parallel": ("expert", "tp-ep"),
    "expert_tensor_model_pipeline_parallel": ("expert", "tp-ep-pp"),
    "expert_data_parallel": ("expert", "dp"),
}


class LayoutError(ParallelConfigError):
    """A layout that cannot hold the model's layers or tensors (the message says why and what fits)."""


def parse_order(order: str, sizes: dict[str, int] | None = None) -> tuple[str, ...]:
    """``"tp-cp-ep-dp-pp"`` -> its dimensions; dimensions left out are appended (only if of size 1)."""
    tokens = [t.strip().lower() for t in order.split("-") if t.strip()]
    unknown = [t for t in tokens if t not in DIMENSIONS]
    if unknown:
        raise ParallelConfigError(
            f"rank order {order!r} names {', '.join(unknown)}", "order",
            f"it may use only {', '.join(DIMENSIONS)} (megatron-core's default is {DEFAULT_ORDER!r})")
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        once = "-".join(dict.fromkeys(tokens))
        raise ParallelConfigError(
            f"rank order {order!r} repeats {', '.join(repeated)}", "order",
            f"name each dimension once, e.g. {once!r} (megatron-core's default is {DEFAULT_ORDER!r})")
    missing = [d for d in DIMENSIONS if d not in tokens]
    for dim in missing:
        size = (sizes or {}).get(dim, 1)
        if size != 1:
            raise ParallelConfigError(f"rank order {order!r} leaves out {dim} but its size is {size}", "order",
                                      f"add {dim} to the order")
    return tuple(tokens + missing)


@dataclass(frozen=True)
class RankRow:
    """One rank's place: node, local rank, and its coordinate in every dimension."""

    rank: int
    node: int
    local_rank: int
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    expert_tp: int
    expert_dp: int


@dataclass(frozen=True)
class Layout:
    """TP x CP x DP x PP over ``world_size`` ranks (EP / expert-TP for MoE layers), in Megatron's order,
    with VPP model chunks per pipeline rank and, when known, the layers each chunk holds.

    Build it with :meth:`from_world` (derives DP from the world and validates), with
    :meth:`build` (places a model's layers), or directly; the constructor validates too.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None
    order: str = DEFAULT_ORDER
    vpp: int = 1
    layer_counts: tuple[int, ...] | None = None  # per model chunk, virtual-stage-major
    _dims: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_sizes(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, expert_tp=self.expert_tp,
                    vpp=self.vpp)
        dims = parse_order(self.order, {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp,
                                        "pp": self.pp})
        object.__setattr__(self, "_dims", dims)
        check_world_size(self.world_size, self.tp, self.pp, self.cp, self.dp, self.ep, self.expert_tp)
        # megatron-core asserts this on the order string as given, with or without experts
        if self.pp > 1 and not self.order.strip().lower().endswith("pp") and self.expert_dp != self.dp:
            raise ParallelConfigError(
                f"with rank order {self.order!r} (pp not last) and PP={self.pp}, the expert layout's DP "
                f"({self.expert_dp} = world / (expert-TP x EP x PP)) must equal the dense DP ({self.dp}), as "
                f"megatron-core requires even without experts", "order",
                f"use order {DEFAULT_ORDER!r}, or sizes with expert-TP x EP = TP x CP")
        if self.layer_counts is not None and len(self.layer_counts) != self.pp * self.vpp:
            raise LayoutError(f"{len(self.layer_counts)} layer counts given for {self.pp} stages x "
                              f"{self.vpp} virtual chunks", "layer-list")

    @classmethod
    def from_world(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                   expert_tp: int | None = None, order: str = DEFAULT_ORDER, dp: int | None = None,
                   flags: ParallelFlags = TRAINING_FLAGS) -> Layout:
        """The layout for ``world_size`` ranks; DP = world / (TP x PP x CP) (raises with remedies)."""
        derived = check_world_size(world_size, tp, pp, cp, dp, ep, expert_tp, flags=flags)
        return cls(tp=tp, pp=pp, dp=derived, cp=cp, ep=ep, expert_tp=expert_tp, order=order)

    @classmethod
    def build(cls, num_layers: int, tp: int = 1, pp: int = 1, vpp: int = 1,
              num_layer_list: Sequence[int] | None = None, flags: ParallelFlags = CONVERT_FLAGS,
              ep: int = 1, expert_tp: int | None = None) -> Layout:
        """``num_layers`` placed evenly, or by ``num_layer_list`` (one count per stage, no virtual chunks).

        With EP > 1 (a checkpoint's layout) DP is the smallest that fits the expert layout:
        TP x DP a multiple of expert-TP x EP."""
        etp = tp if expert_tp is None else expert_tp
        dp = math.lcm(tp, etp * ep) // tp
        return cls(tp=tp, pp=pp, vpp=vpp, dp=dp, ep=ep, expert_tp=expert_tp,
                   layer_counts=place_layers(num_layers, pp, vpp, num_layer_list, flags))

    def placed(self, num_layers: int, num_layer_list: Sequence[int] | None = None,
               flags: ParallelFlags = CONVERT_FLAGS) -> Layout:
        """This layout with ``num_layers`` placed on its stages and chunks (see :meth:`build`)."""
        from dataclasses import replace

        return replace(self, layer_counts=place_layers(num_layers, self.pp, self.vpp, num_layer_list, flags))

    # -- sizes ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def etp(self) -> int:
        """Expert tensor-parallel size (TP unless given)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def expert_dp(self) -> int:
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def dims(self) -> tuple[str, ...]:
        """All five dimensions in rank order (fastest first)."""
        return self._dims

    def sizes(self, layout: str = "dense") -> dict[str, int]:
        """Dimension -> size in the dense (attention) or the expert (MoE) layout."""
        if layout == "dense":
            return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        if layout == "expert":
            return {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.expert_dp, "pp": self.pp}
        raise ValueError(f"layout must be 'dense' or 'expert', got {layout!r}")

    def _strides(self, layout: str) -> dict[str, int]:
        sizes, stride, out = self.sizes(layout), 1, {}
        for dim in self._dims:
            out[dim] = stride
            stride *= sizes[dim]
        return out

    # -- ranks and coordinates -------------------------------------------------------------

    def coordinates(self, rank: int, layout: str = "dense") -> dict[str, int]:
        """``rank`` -> its coordinate in each dimension of ``layout``."""
        self._check_rank(rank)
        sizes, strides = self.sizes(layout), self._strides(layout)
        return {d: (rank // strides[d]) % sizes[d] for d in self._dims}

    def rank_of(self, layout: str = "dense", **coords: int) -> int:
        """The rank at these coordinates (dimensions not given are 0)."""
        sizes, strides = self.sizes(layout), self._strides(layout)
        rank = 0
        for dim, value in coords.items():
            if dim not in sizes:
                raise ValueError(f"unknown dimension {dim!r}; known: {', '.join(DIMENSIONS)}")
            if not 0 <= value < sizes[dim]:
                raise ValueError(f"{dim} coordinate {value} is outside 0..{sizes[dim] - 1} ({layout} layout)")
            rank += value * strides[dim]
        return rank

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    # -- groups ------------------------------------------------------------------------

    def groups(self, dims: str | Iterable[str], layout: str = "dense") -> list[list[int]]:
        """Every group of ranks that differ only in ``dims`` ("dp-cp", ["tp", "pp"]), ascending."""
        wanted = set(dims.split("-") if isinstance(dims, str) else dims)
        unknown = wanted - set(DIMENSIONS)
        if unknown:
            raise ValueError(f"unknown dimension(s) {', '.join(sorted(unknown))}; known: {', '.join(DIMENSIONS)}")
        by_key: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            coords = self.coordinates(rank, layout)
            key = tuple(coords[d] for d in self._dims if d not in wanted)
            by_key.setdefault(key, []).append(rank)
        return sorted(by_key.values())

    def group_of(self, rank: int, dims: str | Iterable[str], layout: str = "dense") -> list[int]:
        """The members of ``rank``'s group for ``dims``."""
        for group in self.groups(dims, layout):
            if rank in group:
                return group
        raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    def embedding_groups(self) -> list[list[int]]:
        """First and last stage of each pipeline (tied embeddings are all-reduced there)."""
        return [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in self.groups("pp")]

    def megatron_groups(self) -> dict[str, list[list[int]]]:
        """Every group megatron-core's ``initialize_model_parallel`` builds, by parallel_state name."""
        out = {name: self.groups(dims, layout) for name, (layout, dims) in MEGATRON_GROUPS.items()}
        out["embedding"] = self.embedding_groups()
        out["position_embedding"] = [[g[0]] for g in self.groups("pp")]
        return out

    def rank_table(self, nproc_per_node: int | None = None) -> list[RankRow]:
        """One row per rank; ``nproc_per_node`` (default: everything on one node) gives node/local rank."""
        per_node = nproc_per_node or self.world_size
        rows = []
        for rank in range(self.world_size):
            dense = self.coordinates(rank)
            expert = self.coordinates(rank, "expert")
            rows.append(RankRow(rank, rank // per_node, rank % per_node, dense["tp"], dense["cp"],
                                expert["ep"], dense["dp"], dense["pp"], expert["tp"], expert["dp"]))
        return rows

    def describe(self) -> str:
        """``TP=2 x CP=2 x DP=2 x PP=3 = 24 ranks, order tp-cp-ep-dp-pp`` (and the expert layout)."""
        text = (f"TP={self.tp} x CP={self.cp} x DP={self.dp} x PP={self.pp} = {self.world_size} ranks, "
                f"order {'-'.join(self._dims)}")
        if self.ep > 1 or self.etp != self.tp:
            text += f"; experts: expert-TP={self.etp} x EP={self.ep} x expert-DP={self.expert_dp} x PP={self.pp}"
        return text

    # -- layers on stages and chunks -----------------------------------------------------------

    def _counts(self) -> tuple[int, ...]:
        if self.layer_counts is None:
            raise LayoutError("this layout places no layers", "layers",
                              "build it with Layout.build(num_layers, ...) or layout.placed(num_layers)")
        return self.layer_counts

    @property
    def num_layers(self) -> int:
        return sum(self._counts())

    @property
    def even(self) -> bool:
        return len(set(self._counts())) == 1

    def stage_layers(self) -> list[int]:
        """Layers per pipeline stage (all its chunks together)."""
        counts = self._counts()
        return [sum(counts[v * self.pp + p] for v in range(self.vpp)) for p in range(self.pp)]

    def chunk_index(self, pp_rank: int, vp: int) -> int:
        return vp * self.pp + pp_rank

    def layers(self, pp_rank: int, vp: int = 0) -> range:
        """Global layer indices held by model chunk ``vp`` of pipeline rank ``pp_rank``."""
        counts = self._counts()
        c = self.chunk_index(pp_rank, vp)
        start = sum(counts[:c])
        return range(start, start + counts[c])

    def is_first(self, pp_rank: int, vp: int) -> bool:
        return pp_rank == 0 and vp == 0

    def is_last(self, pp_rank: int, vp: int) -> bool:
        return pp_rank == self.pp - 1 and vp == self.vpp - 1

    def ranks(self) -> Iterator[tuple[int, int]]:
        """(tp_rank, pp_rank) of each model-parallel rank in checkpoint file order."""
        for p in range(self.pp):
            for t in range(self.tp):
                yield t, p

    def rank_files(self) -> Iterator[tuple[int, int, int]]:
        """(tp_rank, pp_rank, ep_rank) of each file of a legacy checkpoint, pipeline stage slowest."""
        for p in range(self.pp):
            for t in range(self.tp):
                for e in range(self.ep):
                    yield t, p, e

    def describe_shards(self) -> str:
        """``TP 2, PP 3, layers 2,4,2``: how a checkpoint of this layout is cut."""
        extra = f", VPP {self.vpp}" if self.vpp > 1 else ""
        extra += f", EP {self.ep}" if self.ep > 1 else ""
        extra += f", expert-TP {self.etp}" if self.etp != self.tp else ""
        counts = "" if self.even else f", layers {','.join(map(str, self._counts()))}"
        return f"TP {self.tp}, PP {self.pp}{extra}{counts}"


def place_layers(num_layers: int, pp: int, vpp: int = 1, num_layer_list: Sequence[int] | None = None,
                 flags: ParallelFlags = CONVERT_FLAGS) -> tuple[int, ...]:
    """Layer counts per model chunk (virtual-stage-major) for ``num_layers`` over PP x VPP; raises LayoutError."""
    try:
        stages = check_layers(num_layers, pp, vpp, num_layer_list, flags=flags)
    except ParallelConfigError as exc:
        raise LayoutError(exc.finding.message, exc.code, exc.finding.remedy) from None
    if vpp > 1:
        return (num_layers // (pp * vpp),) * (pp * vpp)
    return tuple(stages)
