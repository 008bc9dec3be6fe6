"""Preflight checks for parallel sizes: each failure says the numbers and the nearest valid choices.

These are the rules megatron-core 0.16 enforces (some only deep inside model
construction, some never, which is how a 28-layer model at PP=8 silently built 24
layers in older versions). They are plain functions so the training adaptor, the
checkpoint converter and ``ascend-patch check`` share one wording:

>>> check_layers(28, 8, flags=CONVERT_FLAGS)
Traceback (most recent call last):
...
ascend_patch.comm.preflight.ParallelConfigError: 28 layers cannot be split over 8 pipeline stages; use --target-pipeline-parallel-size 1, 2, 4, 7, 14 or 28, or give --num-layer-list

Every ``check_*`` raises :class:`ParallelConfigError` (a ValueError) and returns the
derived value when there is one; :func:`collect` turns a list of checks into the list
of errors without stopping at the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONVERT_FLAGS",
    "ParallelConfigError",
    "ParallelFlags",
    "TRAINING_FLAGS",
    "check_experts",
    "check_ffn_hidden_size",
    "check_heads",
    "check_layers",
    "check_query_groups",
    "check_seq_length",
    "check_sizes",
    "check_world_size",
    "collect",
    "divisors",
    "format_choices",
    "parse_layer_list",
    "stage_layer_ranges",
]


class ParallelConfigError(ValueError):
    """A parallel size that does not fit the world or the model. ``code`` names the rule."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ParallelFlags:
    """The command-line flag names remedies should mention (training and conversion differ)."""

    tp: str = "--tensor-model-parallel-size"
    pp: str = "--pipeline-model-parallel-size"
    cp: str = "--context-parallel-size"
    ep: str = "--expert-model-parallel-size"
    etp: str = "--expert-tensor-parallel-size"
    vpp: str = "--num-virtual-stages-per-pipeline-rank"
    layer_list: str = "--num-layer-list"
    seq_length: str = "--seq-length"


TRAINING_FLAGS = ParallelFlags()
CONVERT_FLAGS = ParallelFlags(tp="--target-tensor-parallel-size", pp="--target-pipeline-parallel-size",
                              ep="--target-expert-parallel-size", vpp="--virtual-pipeline-parallel-size")


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in ascending order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def format_choices(values: Sequence[Any], limit: int = 10, near: int | None = None) -> str:
    """``1, 2, 4 or 8``; with more than ``limit`` values, the ones nearest to ``near``."""
    items = list(values)
    if len(items) > limit and near is not None:
        items = sorted(sorted(items, key=lambda v: (abs(v - near), v))[:limit])
    items = [str(v) for v in items]
    if not items:
        return "none"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ParallelConfigError(f"{name} must be a positive integer, got {value!r}", "size")


def check_sizes(**sizes: int | None) -> None:
    """Each given size (tp=2, pp=4, ...) is a positive integer."""
    for name, value in sizes.items():
        if value is not None:
            _positive(name.upper(), value)


def check_world_size(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, dp: int | None = None,
                     ep: int = 1, etp: int | None = None, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """World size = TP x PP x CP x DP (DP derived when not given); the expert layout fits too. Returns DP."""
    check_sizes(world_size=world_size, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp)
    model = tp * pp * cp
    if world_size % model:
        lower = (world_size // model) * model
        near = [w for w in (lower, lower + model) if w > 0]
        pps = divisors(world_size // (tp * cp)) if world_size % (tp * cp) == 0 else []
        tps = [t for t in divisors(world_size) if world_size % (t * pp * cp) == 0]
        options = []
        if pps:
            options.append(f"{flags.pp} {format_choices(pps, near=pp)} (with TP={tp}, CP={cp})")
        if tps:
            options.append(f"{flags.tp} {format_choices(tps, near=tp)} (with PP={pp}, CP={cp})")
        alt = ("; or with " + str(world_size) + " ranks use " + "; or ".join(options)) if options else ""
        raise ParallelConfigError(
            f"world size {world_size} is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {model}; "
            f"launch {format_choices(near)} ranks{alt}", "world-size")
    derived = world_size // model
    if dp is not None and dp != derived:
        raise ParallelConfigError(
            f"world size {world_size} = TP x PP x CP x DP needs DP = {world_size} / ({tp} x {pp} x {cp}) = "
            f"{derived}, but DP = {dp} was given; launch {model * dp} ranks for DP = {dp}, or drop the DP size",
            "world-size")
    expert_tp = tp if etp is None else etp
    expert_model = expert_tp * ep * pp
    if world_size % expert_model:
        eps = [e for e in divisors(world_size) if world_size % (expert_tp * e * pp) == 0]
        raise ParallelConfigError(
            f"world size {world_size} is not divisible by expert TP x EP x PP = {expert_tp} x {ep} x {pp} = "
            f"{expert_model}; use {flags.ep} {format_choices(eps, near=ep)}", "expert-world-size")
    return derived


def check_heads(num_attention_heads: int, tp: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Attention heads divide evenly over TP ranks. Returns the heads per rank."""
    check_sizes(num_attention_heads=num_attention_heads, tp=tp)
    if num_attention_heads % tp:
        raise ParallelConfigError(
            f"{num_attention_heads} attention heads cannot be split over {tp} tensor-parallel ranks; "
            f"use {flags.tp} {format_choices(divisors(num_attention_heads), near=tp)}", "heads")
    return num_attention_heads // tp


def check_query_groups(num_query_groups: int, tp: int, num_attention_heads: int | None = None,
                       allow_replication: bool = True, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Query groups (KV heads) vs TP. Returns the query groups per rank (1 when replicated).

    megatron-core 0.16 accepts TP dividing the groups, or (``allow_replication``) the
    groups dividing TP, each KV head then replicated on TP / groups ranks. A consumer
    that cannot replicate (a classic checkpoint layout) passes ``allow_replication=False``.
    """
    check_sizes(num_query_groups=num_query_groups, tp=tp)
    if num_attention_heads is not None and num_attention_heads % num_query_groups:
        raise ParallelConfigError(
            f"{num_attention_heads} attention heads cannot form {num_query_groups} query groups "
            f"(heads must be a multiple of the groups); the model config is inconsistent", "query-groups")
    if num_query_groups % tp == 0:
        return num_query_groups // tp
    if allow_replication and tp % num_query_groups == 0:
        return 1
    valid = divisors(num_query_groups)
    if allow_replication:
        upper = [num_query_groups * k for k in (2, 4, 8) if num_attention_heads is None
                 or num_attention_heads % (num_query_groups * k) == 0]
        valid = sorted(set(valid + upper))
        rule = "TP must divide the query groups, or be a multiple of them (each KV head replicated)"
    else:
        rule = "here TP must divide the query groups (KV heads cannot be replicated)"
    raise ParallelConfigError(
        f"{num_query_groups} query groups (KV heads) do not fit {tp} tensor-parallel ranks: {rule}; "
        f"use {flags.tp} {format_choices(valid, near=tp)}", "query-groups")


def check_ffn_hidden_size(ffn_hidden_size: int, tp: int, flags: ParallelFlags = TRAINING_FLAGS,
                          what: str = "FFN hidden size") -> int:
    """The MLP's hidden size divides over TP ranks. Returns the size per rank."""
    check_sizes(ffn_hidden_size=ffn_hidden_size, tp=tp)
    if ffn_hidden_size % tp:
        raise ParallelConfigError(
            f"{what} {ffn_hidden_size} cannot be split over {tp} tensor-parallel ranks; "
            f"use {flags.tp} {format_choices(divisors(ffn_hidden_size), near=tp)}", "ffn")
    return ffn_hidden_size // tp


def parse_layer_list(value: str | Sequence[int] | None) -> list[int] | None:
    """``"7,7,7,7"`` (or a list) -> [7, 7, 7, 7]; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return [int(v) for v in value.replace(" ", "").split(",") if v != ""]
        except ValueError:
            raise ParallelConfigError(f"--num-layer-list must be comma-separated integers, got {value!r}",
                                      "layer-list") from None
    return [int(v) for v in value]


def check_layers(num_layers: int, pp: int, vpp: int | None = None,
                 num_layer_list: str | Sequence[int] | None = None,
                 flags: ParallelFlags = TRAINING_FLAGS) -> list[int]:
    """Transformer layers over PP stages (and VPP chunks). Returns the layers of each stage."""
    check_sizes(num_layers=num_layers, pp=pp, vpp=vpp)
    stages = parse_layer_list(num_layer_list)
    if stages is not None:
        if vpp is not None and vpp > 1:
            raise ParallelConfigError(
                f"{flags.layer_list} cannot be combined with virtual pipeline stages (VPP={vpp}); "
                f"drop one of them", "layer-list")
        if len(stages) != pp:
            raise ParallelConfigError(
                f"{flags.layer_list} {','.join(map(str, stages))} has {len(stages)} entries but there are "
                f"{pp} pipeline stages; give one count per stage", "layer-list")
        if any(n < 1 for n in stages):
            raise ParallelConfigError(
                f"{flags.layer_list} {','.join(map(str, stages))} gives a stage no layers; every stage "
                "needs at least 1", "layer-list")
        if sum(stages) != num_layers:
            raise ParallelConfigError(
                f"{flags.layer_list} {','.join(map(str, stages))} sums to {sum(stages)} but the model has "
                f"{num_layers} layers", "layer-list")
        return stages
    chunks = pp * (vpp or 1)
    if num_layers % chunks:
        if vpp and vpp > 1:
            valid = [v for v in divisors(num_layers) if v > 1 and num_layers % (pp * v) == 0]
            fix = (f"use {flags.vpp} {format_choices(valid)}" if valid else
                   f"use {flags.pp} {format_choices([p for p in divisors(num_layers) if p > 1])} without VPP")
            raise ParallelConfigError(
                f"{num_layers} layers cannot be split over {pp} pipeline stages x {vpp} virtual stages "
                f"= {chunks} chunks; {fix}", "layers")
        raise ParallelConfigError(
            f"{num_layers} layers cannot be split over {pp} pipeline stages; use {flags.pp} "
            f"{format_choices(divisors(num_layers), near=pp)}, or give {flags.layer_list}", "layers")
    return [num_layers // pp] * pp


def stage_layer_ranges(num_layers: int, pp: int, vpp: int | None = None,
                       num_layer_list: str | Sequence[int] | None = None) -> list[list[range]]:
    """Global layer indices per stage and virtual chunk: ``result[stage][chunk]`` is a range.

    Without VPP each stage has one chunk of consecutive layers; with VPP chunk v of
    stage p holds layers ``v*L/vp + p*L/(PP*vp) + j`` (Megatron's interleaved placement).
    """
    stages = check_layers(num_layers, pp, vpp, num_layer_list)
    vp = vpp or 1
    if vp == 1:
        out, start = [], 0
        for count in stages:
            out.append([range(start, start + count)])
            start += count
        return out
    per_chunk = num_layers // (pp * vp)
    return [[range(v * num_layers // vp + p * per_chunk, v * num_layers // vp + (p + 1) * per_chunk)
             for v in range(vp)] for p in range(pp)]


def check_seq_length(seq_length: int, cp: int, tp: int = 1, sequence_parallel: bool = False,
                     flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Sequence length vs CP (2 x CP load-balanced chunks) and, with sequence parallelism, TP.

    Returns the tokens each rank holds in its sequence dimension.
    """
    check_sizes(seq_length=seq_length, cp=cp, tp=tp)
    need = 2 * cp if cp > 1 else 1
    if sequence_parallel and tp > 1:
        need = math.lcm(need, cp * tp)
    if seq_length % need:
        lower = (seq_length // need) * need
        near = [s for s in (lower, lower + need) if s > 0]
        parts = []
        if cp > 1:
            parts.append(f"2 x CP = {2 * cp} chunks (CP={cp})")
        if sequence_parallel and tp > 1:
            parts.append(f"CP x TP = {cp * tp} sequence-parallel shards (TP={tp})")
        sp = sequence_parallel and tp > 1
        cps = [c for c in divisors(seq_length) if (c == 1 or seq_length % (2 * c) == 0)
               and (not sp or seq_length % (c * tp) == 0)]
        fixes = [f"{flags.seq_length} {format_choices(near)}"]
        if cps:
            fixes.append(f"{flags.cp} {format_choices(cps, near=cp)}")
        if sp:
            base = 2 * cp if cp > 1 else 1
            tps = [t for t in divisors(seq_length) if seq_length % math.lcm(base, cp * t) == 0]
            fixes.append(f"{flags.tp} {format_choices(tps, limit=6, near=tp)}")
            fixes.append("no --sequence-parallel")
        raise ParallelConfigError(
            f"sequence length {seq_length} cannot be split into {' and '.join(parts)}: it must be a multiple "
            f"of {need}; use {', or '.join(fixes)}", "seq-length")
    return seq_length // (cp * (tp if sequence_parallel else 1))


def check_experts(num_experts: int, ep: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Routed experts divide over EP ranks. Returns the experts per rank."""
    check_sizes(num_experts=num_experts, ep=ep)
    if num_experts % ep:
        raise ParallelConfigError(
            f"{num_experts} experts cannot be split over {ep} expert-parallel ranks; use {flags.ep} "
            f"{format_choices(divisors(num_experts), near=ep)}", "experts")
    return num_experts // ep


def collect(*checks: Callable[[], Any]) -> list[ParallelConfigError]:
    """Run each check; return the errors of those that failed (the others' results are dropped)."""
    errors = []
    for check in checks:
        try:
            check()
        except ParallelConfigError as exc:
            errors.append(exc)
    return errors
