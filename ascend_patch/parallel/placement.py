"""Transformer layers over pipeline stages and virtual chunks: the checks, the splits, the placement.

Without virtual stages, stage p holds consecutive layers; with VPP chunks, chunk v of
stage p holds layers ``v*L/vp + p*L/(PP*vp) + j`` (megatron-core's interleaved
placement). An uneven split is an explicit per-stage list (the converter's and
``check``'s ``--num-layer-list``) or, as megatron-core trains it, a first and a last
stage count with even middle stages.

>>> check_layers(28, 8, flags=CONVERT_FLAGS)
Traceback (most recent call last):
...
ascend_patch.parallel.sizes.ParallelConfigError: 28 layers cannot be split over 8 pipeline stages; use --target-pipeline-parallel-size 1, 2, 4, 7, 14 or 28, or give --num-layer-list
"""

from __future__ import annotations

from collections.abc import Sequence

from .sizes import CONVERT_FLAGS, TRAINING_FLAGS, ParallelConfigError, ParallelFlags, check_sizes, divisors, format_choices

__all__ = [
    "CONVERT_FLAGS",
    "balanced_layer_list",
    "check_layers",
    "parse_layer_list",
    "stage_layer_ranges",
    "stages_from_first_last",
    "training_split_flags",
    "uneven_split",
]


def parse_layer_list(value: str | Sequence[int] | None) -> list[int] | None:
    """``"7,7,7,7"`` (or a list) -> [7, 7, 7, 7]; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return [int(v) for v in value.replace(" ", "").split(",") if v != ""]
        except ValueError:
            raise ParallelConfigError(f"--num-layer-list must be comma-separated integers, got {value!r}",
                                      "layer-list", "give one count per pipeline stage, e.g. 7,7,7,7") from None
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
            raise ParallelConfigError(f"{name} must be at least 1, got {value!r}", "layers", "every stage needs a layer")
    if pp == 1:
        raise ParallelConfigError(f"{given} needs pipeline stages, but PP=1", "layers",
                                  f"drop it or use {flags.pp} 2 or more")
    inner = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if (inner == 0 and rest != 0) or (inner > 0 and (rest < inner or rest % inner)):
        split = uneven_split(num_layers, pp)
        fix = f"e.g. {training_split_flags(split, flags)} gives {','.join(map(str, split))}" if split else ""
        raise ParallelConfigError(
            f"{given} leave {rest} of the {num_layers} layers for {inner} middle pipeline stage(s) "
            f"(PP={pp}): megatron-core needs them to divide evenly, at least 1 each", "layers", fix)
    middle = [rest // inner] * inner if inner else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


def _uneven_remedy(num_layers: int, pp: int, flags: ParallelFlags) -> str:
    if flags.first_last:
        split = uneven_split(num_layers, pp)
        if split is None:
            return ""
        return f", or split unevenly: {training_split_flags(split, flags)} gives {','.join(map(str, split))}"
    return f", or give {flags.layer_list}" if flags.layer_list else ""


def _check_layer_list(stages: list[int], num_layers: int, pp: int, vpp: int | None, flags: ParallelFlags) -> None:
    given = f"{flags.layer_list or 'the layer list'} {','.join(map(str, stages))}"
    example = ",".join(map(str, balanced_layer_list(num_layers, pp))) if num_layers >= pp else None
    if vpp is not None and vpp > 1:
        raise ParallelConfigError(
            f"{given} cannot be combined with virtual pipeline stages (VPP={vpp})", "layer-list",
            f"drop the list (VPP needs {num_layers} layers divisible by PP x VPP = {pp * vpp}) or drop {flags.vpp}")
    if len(stages) != pp:
        raise ParallelConfigError(
            f"{given} has {len(stages)} entries but there are {pp} pipeline stages", "layer-list",
            "give one count per stage" + (f", e.g. {example}" if example else ""))
    if any(n < 1 for n in stages):
        raise ParallelConfigError(
            f"{given} gives a stage no layers", "layer-list", "every stage needs at least 1"
            + (f", e.g. {example}" if example else f", and {num_layers} layers cannot fill {pp} stages: "
               f"use {flags.pp} {format_choices(divisors(num_layers), near=pp)}"))
    if sum(stages) != num_layers:
        raise ParallelConfigError(
            f"{given} sums to {sum(stages)} but the model has {num_layers} layers", "layer-list",
            f"make the counts add up to {num_layers}" + (f", e.g. {example}" if example else ""))


def check_layers(num_layers: int, pp: int, vpp: int | None = None,
                 num_layer_list: str | Sequence[int] | None = None,
                 flags: ParallelFlags = TRAINING_FLAGS) -> list[int]:
    """Transformer layers over PP stages (and VPP chunks). Returns the layers of each stage."""
    check_sizes(flags, num_layers=num_layers, pp=pp, vpp=vpp)
    stages = parse_layer_list(num_layer_list)
    if stages is not None:
        _check_layer_list(stages, num_layers, pp, vpp, flags)
        return stages
    chunks = pp * (vpp or 1)
    if num_layers % chunks:
        if vpp and vpp > 1:
            valid = [v for v in divisors(num_layers) if v > 1 and num_layers % (pp * v) == 0]
            fix = (f"use {flags.vpp} {format_choices(valid)}" if valid else
                   f"use {flags.pp} {format_choices([p for p in divisors(num_layers) if p > 1])} without VPP")
            raise ParallelConfigError(
                f"{num_layers} layers cannot be split over {pp} pipeline stages x {vpp} virtual stages "
                f"= {chunks} chunks", "layers", fix)
        raise ParallelConfigError(
            f"{num_layers} layers cannot be split over {pp} pipeline stages", "layers",
            f"use {flags.pp} {format_choices(divisors(num_layers), near=pp)}{_uneven_remedy(num_layers, pp, flags)}")
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
