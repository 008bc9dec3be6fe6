"""Parallel sizes against the world and the model: each failure says the numbers and the nearest valid choices.

These are the rules megatron-core 0.16 enforces (some only deep inside model
construction, some never). Every ``check_*`` raises :class:`ParallelConfigError` (a
ValueError carrying a :class:`~ascend_patch.errors.Finding`) and returns the derived
value when there is one; :func:`collect` runs several checks and returns the findings
of those that failed, without stopping at the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import Finding, FindingError

__all__ = [
    "CONVERT_FLAGS",
    "TRAINING_FLAGS",
    "ParallelConfigError",
    "ParallelFlags",
    "check_experts",
    "check_ffn_hidden_size",
    "check_heads",
    "check_query_groups",
    "check_seq_length",
    "check_sizes",
    "check_world_size",
    "collect",
    "divisors",
    "format_choices",
]


class ParallelConfigError(FindingError):
    """A parallel size that does not fit the world or the model. ``code`` names the rule."""


@dataclass(frozen=True)
class ParallelFlags:
    """The command-line flag names remedies should mention (training and conversion differ).

    ``layer_list`` is the flag taking one layer count per stage where there is one (the
    converter's ``--num-layer-list``; ``ascend-patch check`` has it too). Training has no
    such flag: megatron-core 0.16 splits unevenly only by the first and last stage's counts
    (``TransformerConfig.num_layers_in_first/last_pipeline_stage``, Megatron-LM's
    ``first_last`` flags) or a ``pipeline_model_parallel_layout``; an uneven-split remedy
    names ``first_last`` when it is set, else ``layer_list``.
    """

    tp: str = "--tensor-model-parallel-size"
    pp: str = "--pipeline-model-parallel-size"
    cp: str = "--context-parallel-size"
    ep: str | None = "--expert-model-parallel-size"
    etp: str = "--expert-tensor-parallel-size"
    vpp: str = "--num-virtual-stages-per-pipeline-rank"
    layer_list: str | None = None
    first_last: tuple[str, str] | None = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
    seq_length: str = "--seq-length"


TRAINING_FLAGS = ParallelFlags()
CONVERT_FLAGS = ParallelFlags(tp="--target-tensor-parallel-size", pp="--target-pipeline-parallel-size",
                              ep="--target-expert-parallel-size", etp="--target-expert-tensor-parallel-size",
                              vpp="--virtual-pipeline-parallel-size", layer_list="--num-layer-list",
                              first_last=None)


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


_PARALLEL_KINDS = {"tp": "tensor", "pp": "pipeline", "cp": "context", "ep": "expert", "etp": "expert-tensor",
                   "expert_tp": "expert-tensor"}


def _size_remedy(name: str, flags: ParallelFlags) -> str:
    """What to give instead of a size that is not a positive integer."""
    if name in _PARALLEL_KINDS:
        flag = getattr(flags, "etp" if name == "expert_tp" else name)
        if flag is None:  # the converter has no EP flag: it refuses expert-parallel checkpoints
            return "ascend-patch convert writes EP=1 checkpoints only"
        return f"use {flag} 1 or more (1 means no {_PARALLEL_KINDS[name]} parallelism)"
    if name == "dp":
        return "DP is world / (TP x PP x CP); give a positive DP or leave it out to derive it"
    if name == "vpp":
        return f"use {flags.vpp} 2 or more, or leave it out for no virtual pipeline stages"
    if name == "world_size":
        return "give the number of ranks launched (1 or more)"
    if name == "seq_length":
        return f"use {flags.seq_length} 1 or more"
    return f"the model config is wrong: fix config.json, or the --{name.replace('_', '-')} flag"


def _ep_fix(flags: ParallelFlags, choices: str) -> str:
    if flags.ep is None:
        return f"an expert-parallel size of {choices} would fit (this command takes no expert-parallel flag)"
    return f"use {flags.ep} {choices}"


def check_sizes(flags: ParallelFlags = TRAINING_FLAGS, **sizes: int | None) -> None:
    """Each given size (tp=2, pp=4, ...) is a positive integer; the error names what to give instead."""
    for name, value in sizes.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            shown = ("expert TP" if name in ("etp", "expert_tp") else name.upper()
                     if name in _PARALLEL_KINDS or name in ("dp", "vpp") else name.replace("_", " "))
            raise ParallelConfigError(f"{shown} must be a positive integer, got {value!r}", "size",
                                      _size_remedy(name, flags))


def check_world_size(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, dp: int | None = None,
                     ep: int = 1, etp: int | None = None, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """World size = TP x PP x CP x DP (DP derived when not given); the expert layout fits too. Returns DP."""
    check_sizes(flags, world_size=world_size, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp)
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
            f"world size {world_size} is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {model}",
            "world-size", f"launch {format_choices(near)} ranks{alt}")
    derived = world_size // model
    if dp is not None and dp != derived:
        raise ParallelConfigError(
            f"world size {world_size} = TP x PP x CP x DP needs DP = {world_size} / ({tp} x {pp} x {cp}) = "
            f"{derived}, but DP = {dp} was given", "world-size",
            f"launch {model * dp} ranks for DP = {dp}, or drop the DP size")
    expert_tp = tp if etp is None else etp
    expert_model = expert_tp * ep * pp
    if world_size % expert_model:
        eps = [e for e in divisors(world_size) if world_size % (expert_tp * e * pp) == 0]
        raise ParallelConfigError(
            f"world size {world_size} is not divisible by expert TP x EP x PP = {expert_tp} x {ep} x {pp} = "
            f"{expert_model}", "expert-world-size", _ep_fix(flags, format_choices(eps, near=ep)))
    return derived


def check_heads(num_attention_heads: int, tp: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Attention heads divide evenly over TP ranks. Returns the heads per rank."""
    check_sizes(flags, num_attention_heads=num_attention_heads, tp=tp)
    if num_attention_heads % tp:
        raise ParallelConfigError(
            f"{num_attention_heads} attention heads cannot be split over {tp} tensor-parallel ranks", "heads",
            f"use {flags.tp} {format_choices(divisors(num_attention_heads), near=tp)}")
    return num_attention_heads // tp


def check_query_groups(num_query_groups: int, tp: int, num_attention_heads: int | None = None,
                       allow_replication: bool = True, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Query groups (KV heads) vs TP. Returns the query groups per rank (1 when replicated).

    megatron-core 0.16 accepts TP dividing the groups, or (``allow_replication``) the
    groups dividing TP, each KV head then replicated on TP / groups ranks. A consumer
    that cannot replicate (a classic checkpoint layout) passes ``allow_replication=False``.
    """
    check_sizes(flags, num_query_groups=num_query_groups, tp=tp)
    if num_attention_heads is not None and num_attention_heads % num_query_groups:
        raise ParallelConfigError(
            f"{num_attention_heads} attention heads cannot form {num_query_groups} query groups "
            f"(heads must be a multiple of the groups)", "query-groups", "the model config is inconsistent")
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
        rule = ("ascend-patch convert writes each rank's own KV heads and cannot replicate them, so TP must "
                "divide the query groups")
    raise ParallelConfigError(
        f"{num_query_groups} query groups (KV heads) do not fit {tp} tensor-parallel ranks: {rule}",
        "query-groups", f"use {flags.tp} {format_choices(valid, near=tp)}")


def check_ffn_hidden_size(ffn_hidden_size: int, tp: int, flags: ParallelFlags = TRAINING_FLAGS,
                          what: str = "FFN hidden size") -> int:
    """The MLP's hidden size divides over TP ranks. Returns the size per rank."""
    check_sizes(flags, ffn_hidden_size=ffn_hidden_size, tp=tp)
    if ffn_hidden_size % tp:
        raise ParallelConfigError(
            f"{what} {ffn_hidden_size} cannot be split over {tp} tensor-parallel ranks", "ffn",
            f"use {flags.tp} {format_choices(divisors(ffn_hidden_size), near=tp)}")
    return ffn_hidden_size // tp


def check_seq_length(seq_length: int, cp: int, tp: int = 1, sequence_parallel: bool = False,
                     flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Sequence length vs CP (2 x CP load-balanced chunks) and, with sequence parallelism, TP.

    Returns the tokens each rank holds in its sequence dimension.
    """
    check_sizes(flags, seq_length=seq_length, cp=cp, tp=tp)
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
            # an odd length under CP fits no TP size: "use TP none" is no advice
            tps = [t for t in divisors(seq_length) if seq_length % math.lcm(base, cp * t) == 0]
            if tps:
                fixes.append(f"{flags.tp} {format_choices(tps, limit=6, near=tp)}")
            if seq_length % base == 0:  # else CP's chunks do not fit either, with or without it
                fixes.append("no --sequence-parallel")
        raise ParallelConfigError(
            f"sequence length {seq_length} cannot be split into {' and '.join(parts)}: it must be a multiple "
            f"of {need}", "seq-length", f"use {', or '.join(fixes)}")
    return seq_length // (cp * (tp if sequence_parallel else 1))


def check_experts(num_experts: int, ep: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Routed experts divide over EP ranks. Returns the experts per rank."""
    check_sizes(flags, num_experts=num_experts, ep=ep)
    if num_experts % ep:
        raise ParallelConfigError(
            f"{num_experts} experts cannot be split over {ep} expert-parallel ranks", "experts",
            _ep_fix(flags, format_choices(divisors(num_experts), near=ep)))
    return num_experts // ep


def collect(*checks: Callable[[], Any]) -> list[Finding]:
    """Run each check; return the findings of those that failed (the others' results are dropped)."""
    findings = []
    for check in checks:
        try:
            check()
        except ParallelConfigError as exc:
            findings.append(exc.finding)
    return findings
