"""What could bring a rank under the device's memory: one launch flag changed at a time.

:func:`candidates` lists the changes that keep the launch valid: more recomputation
(``--recompute-granularity``), the distributed optimizer, a larger TP / PP / CP / EP (the
world stays the same, so DP shrinks), a smaller micro-batch (the global batch stays the
same), and for megatron-core's local layers (``--transformer-impl local`` without a
``--spec``), whose attention is unfused, the fused attention of the TE layers. Each is re-estimated by running it (:mod:`.job`), never scaled from the first run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .launchline import LaunchLine, flag, flag_int, with_flag, without

__all__ = ["Candidate", "candidates"]

_FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")


@dataclass(frozen=True)
class Candidate:
    """One change to the launch: how it reads, and the launch's arguments with it."""

    change: str
    argv: tuple[str, ...]


def _set(argv: Sequence[str], name: str, value: int) -> list[str]:
    return with_flag(argv, name, str(value))


def _recompute(argv: list[str]) -> list[Candidate]:
    found = []
    granularity = flag(argv, "recompute-granularity")
    base = without(without(without(argv, "recompute-granularity", 1), "recompute-method", 1), "recompute-num-layers", 1)
    if granularity is None:
        found.append(Candidate("--recompute-granularity selective",
                               tuple([*base, "--recompute-granularity", "selective"])))
    if granularity != "full":
        found.append(Candidate(" ".join(_FULL), tuple([*base, *_FULL])))
    return found


def candidates(line: LaunchLine) -> list[Candidate]:
    """The single-flag changes worth re-estimating for ``line`` (each keeps the sizes valid)."""
    argv = list(line.argv)
    world = line.world_size
    tp = flag_int(argv, "tensor-model-parallel-size", 1) or 1
    pp = flag_int(argv, "pipeline-model-parallel-size", 1) or 1
    cp = flag_int(argv, "context-parallel-size", 1) or 1
    ep = flag_int(argv, "expert-model-parallel-size", 1) or 1
    heads = flag_int(argv, "num-attention-heads")
    groups = flag_int(argv, "num-query-groups") if flag(argv, "group-query-attention") is True else None
    layers = flag_int(argv, "num-layers")
    seq = flag_int(argv, "seq-length")
    mbs = flag_int(argv, "micro-batch-size", 1) or 1
    per_stage = flag_int(argv, "num-layers-per-virtual-pipeline-stage")
    experts = flag_int(argv, "num-experts")
    found = _recompute(argv)
    # the distributed optimizer shards over the data-parallel ranks (the dense part) and the expert data-parallel
    # ranks (the experts): with one of each it changes nothing
    dp = world // (tp * pp * cp)
    expert_dp = world // (pp * ep * (flag_int(argv, "expert-tensor-parallel-size", tp) or tp)) if experts else 1
    if flag(argv, "use-distributed-optimizer") is None and (dp > 1 or expert_dp > 1):
        found.append(Candidate("--use-distributed-optimizer", tuple([*argv, "--use-distributed-optimizer"])))

    def fits_world(t: int, p: int, c: int) -> bool:
        return world % (t * p * c) == 0

    if heads and heads % (2 * tp) == 0 and (not groups or groups % (2 * tp) == 0) and fits_world(2 * tp, pp, cp):
        found.append(Candidate(f"--tensor-model-parallel-size {2 * tp}",
                               tuple(_set(argv, "tensor-model-parallel-size", 2 * tp))))
    if layers and layers % (2 * pp * (per_stage or 1)) == 0 and fits_world(tp, 2 * pp, cp):
        found.append(Candidate(f"--pipeline-model-parallel-size {2 * pp}",
                               tuple(_set(argv, "pipeline-model-parallel-size", 2 * pp))))
    if seq and seq % (4 * cp) == 0 and fits_world(tp, pp, 2 * cp):
        found.append(Candidate(f"--context-parallel-size {2 * cp}", tuple(_set(argv, "context-parallel-size", 2 * cp))))
    if experts and experts % (2 * ep) == 0 and (world // pp) % (2 * ep) == 0:
        found.append(Candidate(f"--expert-model-parallel-size {2 * ep}",
                               tuple(_set(argv, "expert-model-parallel-size", 2 * ep))))
    if mbs > 1:
        found.append(Candidate(f"--micro-batch-size {mbs // 2}", tuple(_set(argv, "micro-batch-size", mbs // 2))))
    if flag(argv, "transformer-impl") == "local" and flag(argv, "spec") is None:
        # the local attention keeps each layer's S x S probabilities; ascend_patch's TE layer runs fused attention
        # (other module names: a checkpoint in the local layout is converted first)
        found.append(Candidate("--transformer-impl transformer_engine",
                               tuple(with_flag(argv, "transformer-impl", "transformer_engine"))))
    return found
