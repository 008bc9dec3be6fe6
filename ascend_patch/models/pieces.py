"""Pieces: the rectangles a weight map describes tensors with, and their algebra.

A :class:`TensorPlan` is one physical tensor filled completely by :class:`Piece` s, each a
rectangle of a canonical (Hugging Face) tensor, or a zero fill. :func:`invert` turns plans
over canonical tensors into canonical tensors over physical ones, :func:`compose` re-expresses
a plan over another checkpoint's physical tensors (mg -> mg without materialising HF
tensors). Megatron's vocabulary padding rows are a canonical tensor of their own,
:func:`padding_key` of the HF key. :mod:`.weightmap` builds plans from rules; nothing here
imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..parallel import LayoutError

__all__ = ["Shape", "Piece", "TensorPlan", "padding_key", "is_padding", "invert", "compose", "coverage_gaps"]

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)  # slots: an MoE checkpoint has tens of thousands of pieces
class Piece:
    """``dst[dst_start : dst_start+size] = src[src_start : src_start+size]`` (per dimension).

    ``src`` is a tensor id in the source space (an HF key for maps; a file-qualified
    id after composition). ``src=None`` is a fill (zeros: vocabulary padding rows the
    source does not hold).
    """

    src: str | None
    src_start: Shape
    dst_start: Shape
    size: Shape

    def rows(self, start: int, stop: int) -> Piece | None:
        """This piece restricted to destination rows [start, stop), or None if disjoint."""
        lo = max(start, self.dst_start[0])
        hi = min(stop, self.dst_start[0] + self.size[0])
        if lo >= hi:
            return None
        shift = lo - self.dst_start[0]
        src_start = self.src_start if self.src is None else (self.src_start[0] + shift, *self.src_start[1:])
        return Piece(self.src, src_start, (lo, *self.dst_start[1:]), (hi - lo, *self.size[1:]))


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One physical tensor: its key, shape and the pieces that fill it completely."""

    key: str
    shape: Shape
    pieces: tuple[Piece, ...]
    rule: str = ""

    def sources(self) -> set[str]:
        return {p.src for p in self.pieces if p.src is not None}


_PADDING = "#vocab-padding"


def padding_key(hf_key: str) -> str:
    """The canonical tensor holding the vocabulary padding rows that follow ``hf_key``'s rows."""
    return hf_key + _PADDING


def is_padding(key: str) -> bool:
    """Whether ``key`` names vocabulary padding rows (see :func:`padding_key`)."""
    return key.endswith(_PADDING)


def invert(plans: Iterable[tuple[str, TensorPlan]]) -> tuple[dict[str, list[Piece]], list[tuple[str, str, Piece]]]:
    """Physical tensors described in canonical terms -> canonical tensors in physical terms.

    ``plans`` yields (physical id, plan). Returns ``(primary, replicas)``: ``primary[K]`` is a
    non-overlapping list of pieces (src = physical id) covering what the physical tensors
    hold of canonical tensor K; ``replicas`` lists (canonical K, physical id, piece) that
    repeat a region already covered (replicated norms on every TP rank, the tied output
    copy), which verification compares but conversion does not need. Fill pieces (zeros)
    have no canonical counterpart and are dropped; vocabulary padding rows are held as
    :func:`padding_key` tensors, which only Megatron targets ask for.
    """
    primary: dict[str, list[Piece]] = {}
    seen: dict[str, dict[tuple[Shape, Shape], str]] = {}
    replicas: list[tuple[str, str, Piece]] = []
    for pid, plan in plans:
        for p in plan.pieces:
            if p.src is None:
                continue
            box = (p.src_start, p.size)
            boxes = seen.setdefault(p.src, {})
            inv = Piece(pid, p.dst_start, p.src_start, p.size)
            if box in boxes:
                replicas.append((p.src, pid, inv))
                continue
            for other_start, other_size in boxes:
                if _overlap(p.src_start, p.size, other_start, other_size):
                    raise LayoutError(f"{pid} holds part of {p.src} that {boxes[(other_start, other_size)]} "
                                      "also holds, with a different split")
            boxes[box] = pid
            primary.setdefault(p.src, []).append(inv)
    return primary, replicas


def _overlap(a0: Shape, asz: Shape, b0: Shape, bsz: Shape) -> bool:
    return all(max(x, y) < min(x + xs, y + ys) for x, xs, y, ys in zip(a0, asz, b0, bsz))


def coverage_gaps(primary: Mapping[str, list[Piece]], shapes: Mapping[str, Shape]) -> dict[str, int]:
    """Canonical tensors not fully covered: key -> number of missing elements."""
    gaps = {}
    for key, shape in shapes.items():
        covered = sum(math.prod(p.size) for p in primary.get(key, ()))
        if covered != math.prod(shape):
            gaps[key] = math.prod(shape) - covered
    return gaps


def compose(plan: TensorPlan, source: Mapping[str, list[Piece]], *, fill_padding: bool = True) -> TensorPlan:
    """Re-express ``plan`` (pieces over canonical tensors) over the physical tensors of ``source``.

    Vocabulary padding rows (:func:`is_padding`) that ``source`` does not hold become
    zero fills (unless ``fill_padding`` is False); every other canonical element must be held.
    """
    out: list[Piece] = []
    for p in plan.pieces:
        if p.src is None:
            out.append(p)
            continue
        entries = source.get(p.src)
        if fill_padding and is_padding(p.src):
            out += _padding_pieces(plan, p, entries or [], source)
            continue
        if not entries:
            raise LayoutError(f"{plan.key} needs {p.src}, which the source checkpoint does not hold")
        if len(entries) == 1 and not any(entries[0].dst_start) and not any(entries[0].src_start) and all(
                a + s <= z for a, s, z in zip(p.src_start, p.size, entries[0].size)):
            # the canonical tensor is one stored tensor as it is (every HF source): rename, no arithmetic
            out.append(Piece(entries[0].src, p.src_start, p.dst_start, p.size))
            continue
        got = 0
        for e in entries:
            # e: canonical region [e.dst_start, +e.size) lives in physical e.src at e.src_start.
            lo = tuple(max(a, c) for a, c in zip(p.src_start, e.dst_start))
            hi = tuple(min(a + s, c + z) for a, s, c, z in zip(p.src_start, p.size, e.dst_start, e.size))
            if any(x >= y for x, y in zip(lo, hi)):
                continue
            size = tuple(y - x for x, y in zip(lo, hi))
            out.append(Piece(e.src, tuple(u + x - c for u, x, c in zip(e.src_start, lo, e.dst_start)),
                             tuple(b + x - a for b, x, a in zip(p.dst_start, lo, p.src_start)), size))
            got += math.prod(size)
        if got != math.prod(p.size):
            raise LayoutError(f"the source checkpoint holds only {got} of the {math.prod(p.size)} elements of "
                              f"{p.src} that {plan.key} needs")
    return TensorPlan(plan.key, plan.shape, tuple(out), plan.rule)


def _padding_pieces(plan: TensorPlan, p: Piece, entries: list[Piece],
                    source: Mapping[str, list[Piece]]) -> list[Piece]:
    """Padding rows of ``p``: the rows the source holds composed as usual, zero fills for the others.

    Megatron splits the vocabulary by rows only, so the source holds whole rows of it.
    """
    first, end = p.src_start[0], p.src_start[0] + p.size[0]
    spans = sorted((max(first, e.dst_start[0]), min(end, e.dst_start[0] + e.size[0])) for e in entries)
    out: list[Piece] = []
    row = first
    for lo, hi in [*((a, b) for a, b in spans if a < b), (end, end)]:
        if lo > row:  # rows [row, lo) the source does not hold
            out.append(Piece(None, (row, *p.src_start[1:]), (p.dst_start[0] + row - first, *p.dst_start[1:]),
                             (lo - row, *p.size[1:])))
        if hi > max(lo, row):
            lo = max(lo, row)
            held = Piece(p.src, (lo, *p.src_start[1:]), (p.dst_start[0] + lo - first, *p.dst_start[1:]),
                         (hi - lo, *p.size[1:]))
            out += compose(TensorPlan(plan.key, plan.shape, (held,), plan.rule), source, fill_padding=False).pieces
        row = max(row, hi)
    return out
