"""Which Phi-3 tensors are stacks of canonical (llama-map) tensors, and the pieces that say so.

A fused tensor is its parts concatenated along dim 0, in order. Everything here is plain
data over shapes; the converter's engine streams the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ascend_patch.models.weightmap import Piece, TensorPlan

__all__ = ["FUSED", "fused_shapes", "fused_plans", "canonical_pieces"]

# fused suffix -> the canonical suffixes stacked in it (per layer: model.layers.{i}.<suffix>)
FUSED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}

Shape = tuple[int, ...]


def _groups(canonical: Mapping[str, Shape]) -> dict[str, list[str]]:
    """fused key -> its canonical keys, for every layer the canonical shapes name."""
    out: dict[str, list[str]] = {}
    for key in canonical:
        for fused, parts in FUSED.items():
            for part in parts:
                if key.endswith("." + part):
                    stem = key[: -len(part)]
                    out.setdefault(stem + fused, [stem + p for p in parts])
    return out


def fused_shapes(canonical: Mapping[str, Shape]) -> dict[str, Shape]:
    """The tensors a Phi-3 checkpoint holds, key -> shape, given the canonical ones."""
    groups = _groups(canonical)
    inside = {k for parts in groups.values() for k in parts}
    shapes = {k: tuple(s) for k, s in canonical.items() if k not in inside}
    for fused, parts in groups.items():
        rest = tuple(canonical[parts[0]][1:])
        shapes[fused] = (sum(canonical[p][0] for p in parts), *rest)
    return shapes


def fused_plans(canonical: Mapping[str, Shape]) -> dict[str, TensorPlan]:
    """Every Phi-3 tensor as pieces of canonical tensors (a fused one: its parts, row after row)."""
    groups = _groups(canonical)
    inside = {k for parts in groups.values() for k in parts}
    plans: dict[str, TensorPlan] = {}
    for key, shape in canonical.items():
        if key not in inside:
            zeros = (0,) * len(shape)
            plans[key] = TensorPlan(key, tuple(shape), (Piece(key, zeros, zeros, tuple(shape)),), "identity")
    for fused, parts in groups.items():
        pieces, row = [], 0
        for part in parts:
            shape = tuple(canonical[part])
            zeros = (0,) * len(shape)
            pieces.append(Piece(part, zeros, (row, *zeros[1:]), shape))
            row += shape[0]
        plans[fused] = TensorPlan(fused, (row, *canonical[parts[0]][1:]), tuple(pieces), "fused")
    return plans


def canonical_pieces(plans: Mapping[str, TensorPlan]) -> dict[str, list[Piece]]:
    """The inverse view the loader needs: each canonical tensor as a region of a stored one."""
    out: dict[str, list[Piece]] = {}
    for stored, plan in plans.items():
        for p in plan.pieces:
            # plan: stored[p.dst_start : +p.size] = canonical p.src[p.src_start : +p.size]
            out.setdefault(p.src, []).append(Piece(stored, p.dst_start, p.src_start, p.size))
    return out
