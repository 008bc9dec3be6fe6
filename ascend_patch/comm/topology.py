"""Megatron's parallel topology: which rank holds which TP / CP / EP / DP / PP coordinate.

Rank order (megatron-core ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``): the
dimensions are listed fastest-varying first, so with sizes ``s_0, s_1, ...`` in that
order a rank is ``c_0 + s_0 * (c_1 + s_1 * (c_2 + ...))``. Two layouts share the world:

* the dense (attention) layout uses TP, CP, DP, PP (EP is 1 there);
* the expert (MoE) layout uses expert-TP (default TP), EP, expert-DP, PP (CP is 1 there),
  expert-DP = world / (expert-TP x EP x PP).

A group for a set of dimensions ("dp-cp", "tp-pp", ...) is every set of ranks that
agree on all the other dimensions; groups and their members are listed in ascending
rank order, as megatron-core builds them. The validation functions live in
:mod:`ascend_patch.comm.preflight` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .preflight import (
    CONVERT_FLAGS,
    TRAINING_FLAGS,
    ParallelConfigError,
    ParallelFlags,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_layers,
    check_query_groups,
    check_seq_length,
    check_sizes,
    check_world_size,
    collect,
    stage_layer_ranges,
)

__all__ = [
    "CONVERT_FLAGS",
    "DEFAULT_ORDER",
    "DIMENSIONS",
    "MEGATRON_GROUPS",
    "ParallelConfigError",
    "ParallelFlags",
    "ParallelLayout",
    "RankRow",
    "TRAINING_FLAGS",
    "check_experts",
    "check_ffn_hidden_size",
    "check_heads",
    "check_layers",
    "check_query_groups",
    "check_seq_length",
    "check_world_size",
    "collect",
    "parse_order",
    "stage_layer_ranges",
]

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


def parse_order(order: str, sizes: dict[str, int] | None = None) -> tuple[str, ...]:
    """``"tp-cp-ep-dp-pp"`` -> its dimensions; dimensions left out are appended (only if of size 1)."""
    tokens = [t.strip().lower() for t in order.split("-") if t.strip()]
    unknown = [t for t in tokens if t not in DIMENSIONS]
    if unknown:
        raise ParallelConfigError(
            f"rank order {order!r} names {', '.join(unknown)}; it may use only {', '.join(DIMENSIONS)} "
            f"(megatron-core's default is {DEFAULT_ORDER!r})", "order")
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        once = "-".join(dict.fromkeys(tokens))
        raise ParallelConfigError(
            f"rank order {order!r} repeats {', '.join(repeated)}; name each dimension once, e.g. {once!r} "
            f"(megatron-core's default is {DEFAULT_ORDER!r})", "order")
    missing = [d for d in DIMENSIONS if d not in tokens]
    for dim in missing:
        size = (sizes or {}).get(dim, 1)
        if size != 1:
            raise ParallelConfigError(
                f"rank order {order!r} leaves out {dim} but its size is {size}; add {dim} to the order",
                "order")
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
class ParallelLayout:
    """TP x CP x DP x PP over ``world_size`` ranks (with EP / expert-TP for MoE layers), in Megatron's order.

    Build it with :meth:`from_world` (which derives DP and validates) or directly with
    every size; the constructor validates as well.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None
    order: str = DEFAULT_ORDER
    _dims: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_sizes(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, expert_tp=self.expert_tp)
        dims = parse_order(self.order, {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp,
                                        "pp": self.pp})
        object.__setattr__(self, "_dims", dims)
        check_world_size(self.world_size, self.tp, self.pp, self.cp, self.dp, self.ep, self.expert_tp)
        # megatron-core asserts this on the order string as given, with or without experts
        if self.pp > 1 and not self.order.strip().lower().endswith("pp") and self.expert_dp != self.dp:
            raise ParallelConfigError(
                f"with rank order {self.order!r} (pp not last) and PP={self.pp}, the expert layout's DP "
                f"({self.expert_dp} = world / (expert-TP x EP x PP)) must equal the dense DP ({self.dp}), as "
                f"megatron-core requires even without experts; use order {DEFAULT_ORDER!r}, or sizes with "
                f"expert-TP x EP = TP x CP", "order")

    @classmethod
    def from_world(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                   expert_tp: int | None = None, order: str = DEFAULT_ORDER, dp: int | None = None,
                   flags: ParallelFlags = TRAINING_FLAGS) -> ParallelLayout:
        """The layout for ``world_size`` ranks; DP = world / (TP x PP x CP) (raises with remedies)."""
        derived = check_world_size(world_size, tp, pp, cp, dp, ep, expert_tp, flags=flags)
        return cls(tp=tp, pp=pp, dp=derived, cp=cp, ep=ep, expert_tp=expert_tp, order=order)

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

    # -- the table a user draws by hand -------------------------------------------------------

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
