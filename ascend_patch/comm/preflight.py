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
    "TRAINING_FLAGS",
    "ParallelConfigError",
    "ParallelFlags",
    "balanced_layer_list",
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
    "stages_from_first_last",
    "training_split_flags",
    "uneven_split",
]


class ParallelConfigError(ValueError):
    """A parallel size that does not fit the world or the model. ``code`` names the rule."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


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
# ascend-patch convert refuses expert-parallel checkpoints, so it has no EP flag to name
CONVERT_FLAGS = ParallelFlags(tp="--target-tensor-parallel-size", pp="--target-pipeline-parallel-size",
                              ep=None, vpp="--virtual-pipeline-parallel-size", layer_list="--num-layer-list",
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
        return f"EP {choices} would fit, but ascend-patch convert writes EP=1 checkpoints only"
    return f"use {flags.ep} {choices}"


def check_sizes(flags: ParallelFlags = TRAINING_FLAGS, **sizes: int | None) -> None:
    """Each given size (tp=2, pp=4, ...) is a positive integer; the error names what to give instead."""
    for name, value in sizes.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            shown = ("expert TP" if name in ("etp", "expert_tp") else name.upper()
                     if name in _PARALLEL_KINDS or name in ("dp", "vpp") else name.replace("_", " "))
            raise ParallelConfigError(f"{shown} must be a positive integer, got {value!r}; "
                                      f"{_size_remedy(name, flags)}", "size")


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
            f"{expert_model}; {_ep_fix(flags, format_choices(eps, near=ep))}", "expert-world-size")
    return derived


def check_heads(num_attention_heads: int, tp: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Attention heads divide evenly over TP ranks. Returns the heads per rank."""
    check_sizes(flags, num_attention_heads=num_attention_heads, tp=tp)
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
    check_sizes(flags, num_query_groups=num_query_groups, tp=tp)
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
    check_sizes(flags, ffn_hidden_size=ffn_hidden_size, tp=tp)
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
            raise ParallelConfigError(f"--num-layer-list must be comma-separated integers, got {value!r}; "
                                      "give one count per pipeline stage, e.g. 7,7,7,7", "layer-list") from None
    return [int(v) for v in value]


def balanced_layer_list(num_layers: int, pp: int) -> list[int]:
    """``num_layers`` over ``pp`` stages as evenly as counts allow (earlier stages take the remainder)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def uneven_split(num_layers: int, pp: int) -> list[int] | None:
    """The split megatron-core can build from a first and a last stage count: the middle stages
    even, the largest stage as small as possible (ties: lighter first/last stages, which also hold
    the embedding and the loss). None when there are fewer layers than stages."""
    if pp < 2 or num_layers < pp:
        return None
    if pp == 2:
        return [num_layers - num_layers // 2, num_layers // 2]
    best = None
    for middle in range(1, num_layers):
        rest = num_layers - (pp - 2) * middle
        if rest < 2:
            break
        first, last = rest - rest // 2, rest // 2
        key = (max(middle, first), -middle)
        if best is None or key < best[0]:
            best = (key, [first] + [middle] * (pp - 2) + [last])
    return best[1] if best else None


def training_split_flags(stages: Sequence[int], flags: ParallelFlags = TRAINING_FLAGS) -> str:
    """The training flags that place ``stages`` layers on the pipeline stages ("" for an even split).

    Megatron-LM's first/last-stage flags when the middle stages are even, else its
    ``--pipeline-model-parallel-layout`` (E = embedding, t*n = n layers, L = loss, | between stages).
    """
    stages = list(stages)
    if len(set(stages)) <= 1:
        return ""
    middle = stages[1:-1]
    if flags.first_last and len(set(middle)) <= 1:
        first_flag, last_flag = flags.first_last
        parts = []
        if not middle or stages[0] != middle[0]:
            parts.append(f"{first_flag} {stages[0]}")
        if not middle or stages[-1] != middle[0]:
            parts.append(f"{last_flag} {stages[-1]}")
        return " ".join(parts)
    layout = "|".join(f"t*{n}" for n in stages)
    return f"--pipeline-model-parallel-layout 'E{layout}L'"


def stages_from_first_last(num_layers: int, pp: int, first: int | None = None, last: int | None = None,
                           flags: ParallelFlags = TRAINING_FLAGS) -> list[int]:
    """The stages megatron-core builds from a first and/or last stage's layer count (the middle ones even)."""
    check_sizes(flags, num_layers=num_layers, pp=pp)
    names = flags.first_last or ("the first stage's count", "the last stage's count")
    given = " and ".join(f"{n} {v}" for n, v in zip(names, (first, last)) if v is not None)
    for name, value in zip(names, (first, last)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ParallelConfigError(f"{name} must be at least 1, got {value!r}; every stage needs a layer", "layers")
    if pp == 1:
        raise ParallelConfigError(f"{given} needs pipeline stages, but PP=1; drop it or use {flags.pp} 2 or more",
                                  "layers")
    inner = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if (inner == 0 and rest != 0) or (inner > 0 and (rest < inner or rest % inner)):
        split = uneven_split(num_layers, pp)
        fix = f"; e.g. {training_split_flags(split, flags)} gives {','.join(map(str, split))}" if split else ""
        raise ParallelConfigError(
            f"{given} leave {rest} of the {num_layers} layers for {inner} middle pipeline stage(s) "
            f"(PP={pp}): megatron-core needs them to divide evenly, at least 1 each{fix}", "layers")
    middle = [rest // inner] * inner if inner else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


def _uneven_remedy(num_layers: int, pp: int, flags: ParallelFlags) -> str:
    if flags.first_last:
        split = uneven_split(num_layers, pp)
        if split is None:
            return ""
        return f", or split unevenly: {training_split_flags(split, flags)} gives {','.join(map(str, split))}"
    return f", or give {flags.layer_list}" if flags.layer_list else ""


def check_layers(num_layers: int, pp: int, vpp: int | None = None,
                 num_layer_list: str | Sequence[int] | None = None,
                 flags: ParallelFlags = TRAINING_FLAGS) -> list[int]:
    """Transformer layers over PP stages (and VPP chunks). Returns the layers of each stage."""
    check_sizes(flags, num_layers=num_layers, pp=pp, vpp=vpp)
    stages = parse_layer_list(num_layer_list)
    if stages is not None:
        given = f"{flags.layer_list or 'the layer list'} {','.join(map(str, stages))}"
        example = ",".join(map(str, balanced_layer_list(num_layers, pp))) if num_layers >= pp else None
        if vpp is not None and vpp > 1:
            raise ParallelConfigError(
                f"{given} cannot be combined with virtual pipeline stages (VPP={vpp}); drop the list "
                f"(VPP needs {num_layers} layers divisible by PP x VPP = {pp * vpp}) or drop {flags.vpp}",
                "layer-list")
        if len(stages) != pp:
            raise ParallelConfigError(
                f"{given} has {len(stages)} entries but there are {pp} pipeline stages; give one count per "
                f"stage" + (f", e.g. {example}" if example else ""), "layer-list")
        if any(n < 1 for n in stages):
            raise ParallelConfigError(
                f"{given} gives a stage no layers; every stage needs at least 1"
                + (f", e.g. {example}" if example else f", and {num_layers} layers cannot fill {pp} stages: "
                   f"use {flags.pp} {format_choices(divisors(num_layers), near=pp)}"), "layer-list")
        if sum(stages) != num_layers:
            raise ParallelConfigError(
                f"{given} sums to {sum(stages)} but the model has {num_layers} layers; make the counts add up "
                f"to {num_layers}" + (f", e.g. {example}" if example else ""), "layer-list")
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
            f"{format_choices(divisors(num_layers), near=pp)}{_uneven_remedy(num_layers, pp, flags)}", "layers")
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
            tps = [t for t in divisors(seq_length) if seq_length % math.lcm(base, cp * t) == 0]
            fixes.append(f"{flags.tp} {format_choices(tps, limit=6, near=tp)}")
            fixes.append("no --sequence-parallel")
        raise ParallelConfigError(
            f"sequence length {seq_length} cannot be split into {' and '.join(parts)}: it must be a multiple "
            f"of {need}; use {', or '.join(fixes)}", "seq-length")
    return seq_length // (cp * (tp if sequence_parallel else 1))


def check_experts(num_experts: int, ep: int, flags: ParallelFlags = TRAINING_FLAGS) -> int:
    """Routed experts divide over EP ranks. Returns the experts per rank."""
    check_sizes(flags, num_experts=num_experts, ep=ep)
    if num_experts % ep:
        raise ParallelConfigError(
            f"{num_experts} experts cannot be split over {ep} expert-parallel ranks; "
            f"{_ep_fix(flags, format_choices(divisors(num_experts), near=ep))}", "experts")
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
