"""The estimate itself: the launch's own Megatron-LM, one simulated rank per role, two iterations each.

Runs in a process patched for the cpu target (:mod:`.worker`). :func:`estimate_argv` turns the
launch's arguments into the ones the estimate runs (the same model, layout, schedule and
recompute; no checkpoint, no data files, two iterations, and only as many micro-batches as the
schedule's memory pattern needs, :func:`microbatches_needed`); :func:`roles` groups the ranks
whose memory is the same (one per pipeline stage); :func:`estimate_roles` runs Megatron-LM's
``pretrain`` for one rank of each.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import FindingError
from ...parallel import Layout, ParallelConfigError
from .launchline import LaunchLine, flag, flag_int, with_flag, without
from .megatron_names import DROPPED_FLAGS
from .tracking import Terms
from .vocab import null_tokenizer_vocab_size

__all__ = ["Role", "RoleEstimate", "estimate_argv", "estimate_roles", "microbatches_needed", "roles"]

# flags the estimate always sets itself (not worth a note)
_REPLACED = ("train-iters", "eval-iters", "eval-interval")
# tokenizer flags that name files; without them on this machine the estimate needs the vocabulary size
_TOKENIZER_FILES = ("tokenizer-model", "vocab-file", "merge-file")


@dataclass(frozen=True)
class Role:
    """Ranks whose memory is the same; ``rank`` is the one simulated."""

    name: str
    rank: int
    ranks: tuple[int, ...]


@dataclass
class RoleEstimate:
    """One role's terms, and what the simulation had to assume."""

    role: Role
    terms: Terms
    communicators: list[tuple[int, ...]] = field(default_factory=list)
    p2p_peers: list[int] = field(default_factory=list)
    p2p_groups: list[tuple[int, ...]] = field(default_factory=list)
    asked: list[tuple[str, str, str, int]] = field(default_factory=list)
    num_microbatches: int | None = None
    seconds: float = 0.0
    formula: dict = field(default_factory=dict)


def _sizes(argv: Sequence[str]) -> dict[str, int]:
    tp = flag_int(argv, "tensor-model-parallel-size", 1) or 1
    pp = flag_int(argv, "pipeline-model-parallel-size", 1) or 1
    cp = flag_int(argv, "context-parallel-size", 1) or 1
    ep = flag_int(argv, "expert-model-parallel-size", 1) or 1
    vpp = flag_int(argv, "num-virtual-stages-per-pipeline-rank") or flag_int(argv, "virtual-pipeline-model-parallel-size")
    per_stage = flag_int(argv, "num-layers-per-virtual-pipeline-stage")
    layers = flag_int(argv, "num-layers")
    if vpp is None and per_stage and layers:
        vpp = layers // (pp * per_stage)
    return {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp or 1,
            "group": flag_int(argv, "microbatch-group-size-per-virtual-pipeline-stage") or pp}


def microbatches_needed(total: int, pp: int, vpp: int = 1, group: int | None = None) -> int:
    """The fewest micro-batches whose schedule reaches the same memory peak as ``total`` do.

    Without pipelining one micro-batch is the whole pattern. 1F1B keeps at most ``pp - stage``
    micro-batches in flight, reached once ``pp`` have started. The interleaved schedule warms
    up ``2 (pp - 1) + (vpp - 1) group`` virtual micro-batches on the first stage; after one full
    cycle of ``group x vpp`` more, its steady state repeats.
    """
    if pp == 1:
        return min(total, 1)
    if vpp <= 1:
        return min(total, pp)
    group = group or pp
    warmup = 2 * (pp - 1) + (vpp - 1) * group
    needed = group
    while needed * vpp < warmup + 1 + group * vpp:
        needed += group
    return min(total, needed)


def estimate_argv(line: LaunchLine, vocab_size: int | None = None) -> tuple[list[str], list[str]]:
    """The launch's Megatron arguments as the estimate runs them, and one note per change."""
    argv, notes = list(line.argv), []
    dropped = [f"--{name}" for name in DROPPED_FLAGS if flag(argv, name) is not None and name not in _REPLACED]
    for name, count in DROPPED_FLAGS.items():
        argv = without(argv, name, count)
    if dropped:
        notes.append(f"not used by the estimate: {', '.join(dropped)} (checkpoints, logs, schedule length)")
    argv += ["--train-iters", "2", "--eval-iters", "0", "--eval-interval", "1000000"]
    s = _sizes(argv)
    world = line.world_size
    model_parallel = s["tp"] * s["pp"] * s["cp"]
    if world % model_parallel:
        raise FindingError(f"{world} ranks are not a multiple of TP x PP x CP = {model_parallel}", "memory-layout",
                           "fix the launch's sizes (ascend-patch check without --memory lists the valid ones)")
    dp = world // model_parallel
    mbs = flag_int(argv, "micro-batch-size", 1) or 1
    gbs = flag_int(argv, "global-batch-size", mbs * dp) or mbs * dp
    total = max(1, gbs // (mbs * dp))
    needed = microbatches_needed(total, s["pp"], s["vpp"], s["group"])
    if needed < total:
        argv = with_flag(argv, "global-batch-size", str(needed * mbs * dp))
        notes.append(f"ran {needed} of the {total} micro-batches per iteration (global batch {gbs}): the "
                     f"schedule's memory peak is reached by then and repeats after")
    kind = flag(argv, "tokenizer-type")
    files = [str(flag(argv, name)) for name in _TOKENIZER_FILES if isinstance(flag(argv, name), str)]
    if kind not in (None, "NullTokenizer") and (not files or not all(os.path.exists(f) for f in files)):
        if vocab_size is None:
            raise FindingError(f"the launch's tokenizer ({kind}{': ' + ', '.join(files) if files else ''}) is not on "
                               "this machine, and the vocabulary size decides the embedding and output layers",
                               "memory-vocab", "give --vocab-size N (the tokenizer's size) or --hf-config")
        for name in ("tokenizer-type", *_TOKENIZER_FILES):
            argv = without(argv, name, 1)
        argv = with_flag(argv, "vocab-size", str(null_tokenizer_vocab_size(vocab_size)))
        argv += ["--tokenizer-type", "NullTokenizer"]
        notes.append(f"the tokenizer is not on this machine: a {vocab_size}-token vocabulary stands for it")
    return argv, notes


def roles(line: LaunchLine, argv: Sequence[str]) -> list[Role]:
    """One role per pipeline stage: TP, CP, DP and EP shards of a stage hold the same bytes in Megatron's layouts."""
    s = _sizes(argv)
    order = "tp-cp-ep-pp-dp" if flag(argv, "use-tp-pp-dp-mapping") is True else "tp-cp-ep-dp-pp"
    try:
        layout = Layout.from_world(line.world_size, tp=s["tp"], pp=s["pp"], cp=s["cp"], ep=s["ep"],
                                   expert_tp=flag_int(argv, "expert-tensor-parallel-size"), order=order)
    except ParallelConfigError as exc:
        raise FindingError(exc.finding.message, exc.finding.code, exc.finding.remedy) from None
    rows = layout.rank_table(line.nproc_per_node)
    pp = s["pp"]
    found = []
    for stage in range(pp):
        ranks = tuple(r.rank for r in rows if r.pp == stage)
        where = "" if pp == 1 else " (first)" if stage == 0 else " (last)" if stage == pp - 1 else ""
        name = "every rank" if pp == 1 else f"pipeline stage {stage}{where}"
        found.append(Role(name, min(ranks), ranks))
    return found


def estimate_roles(line: LaunchLine, argv: list[str], which: Sequence[Role], state_only: bool = False
                   ) -> list[RoleEstimate]:
    """Megatron-LM's pretrain for one simulated rank of each role (this process must be patched for cpu).

    ``state_only``: stop once the model and the optimizer state exist (no step; activations 0).
    """
    from .megatron_lm import StepsDone, capture_pretrain, recorded_steps, teardown
    from .simulate import fake_device, simulated_rank

    script = os.path.abspath(line.script)
    folder = os.path.dirname(script)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    results = []
    saved_argv = sys.argv
    for role in which:
        start = time.perf_counter()
        with simulated_rank(line.world_size, role.rank, line.nproc_per_node):
            try:
                # as the rank (Megatron-LM main's script parses and checks its arguments against the world
                # itself before it calls pretrain), with real tensors (what the script makes at import stays real)
                call = capture_pretrain(script, argv)
                steps = recorded_steps(synthetic_data=True, stop_after=True, state_only=state_only)
                with fake_device() as answers, steps as record:
                    sys.argv = [script, *argv]
                    try:
                        call.run()
                    except StepsDone:
                        pass
            finally:
                sys.argv = saved_argv
                teardown()
        if record.terms is None:
            raise FindingError(f"pretrain ended before its second iteration on rank {role.rank}", "memory-run",
                               "the launch's schedule must run two iterations (check --train-iters handling)")
        asked = sorted(((q, a, w, n) for (q, a, w), n in answers.asked.items()), key=lambda x: -x[3])
        results.append(RoleEstimate(role, record.terms, sorted(answers.groups), sorted(answers.peers),
                                    sorted(answers.p2p_groups), asked, record.num_microbatches,
                                    time.perf_counter() - start, record.extra.get("formula", {})))
    return results
