"""Real values behind the few small fake tensors whose values decide shapes: MoE token counts.

A mixture-of-experts layer turns its router's choices into shapes: how many tokens each expert
receives, the all-to-all split sizes, the grouped GEMM's groups. Fake tensors carry no values,
so :class:`Shadows` keeps a small real tensor (a *shadow*) next to a fake one where the value
is known and cheap:

* value-known factories (``arange``, ``zeros``, ``full``, ``ones_like``, a literal ...);
* ``topk`` over values nobody knows (router scores): the **capacity assumption**: the
  ``t``-th row picks ``(t k + j) mod n``, so every expert receives the same number of tokens
  (``tokens x k / experts``), on every rank;
* any op whose fake inputs all have shadows (its real result, on the shadows), including the
  ops whose output shape depends on values (``nonzero``, ``masked_select``);
* collectives, with every rank assumed to hold what this one holds: an all-gather repeats the
  input, a sum all-reduce multiplies it by the group size, an all-to-all sends each rank the
  chunk this rank would receive from itself.

Only tensors of up to :data:`LIMIT` elements are shadowed; every other op runs fake.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LIMIT", "Shadows"]

LIMIT = 1 << 22  # elements; a routing map of 4096 tokens x 128 experts is 1 << 19


class Shadows:
    """Fake tensor -> its real value, for the tensors :mod:`.shadows` can know."""

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self._map = WeakIdKeyDictionary()

    def get(self, t: Any) -> Any:
        """The shadow of ``t``, or None."""
        try:
            return self._map.get(t)
        except TypeError:
            return None

    def set(self, fake: Any, real: Any) -> None:
        """Remember ``real`` as the value of ``fake`` (when small enough)."""
        if real is not None and real.numel() <= LIMIT and tuple(real.shape) == tuple(fake.shape):
            self._map[fake] = real

    def drop(self, fake: Any) -> None:
        """Forget the shadow of ``fake`` (an op changed it in a way the shadows cannot follow)."""
        self._map.pop(fake, None)

    def real_args(self, args: Any, kwargs: dict) -> tuple[Any, dict] | None:
        """``(args, kwargs)`` with every fake tensor replaced by its shadow; None if one has no shadow."""
        import torch
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._pytree import tree_map

        missing = []

        def swap(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                real = self.get(x)
                if real is None:
                    missing.append(x)
                return real
            return x

        real_args, real_kwargs = tree_map(swap, (args, kwargs))
        if missing:
            return None
        return real_args, real_kwargs if isinstance(real_kwargs, dict) else dict(real_kwargs)

    def attach(self, fake_out: Any, real_out: Any) -> None:
        """Shadow each fake output with the matching real one."""
        import torch
        from torch.utils._pytree import tree_leaves

        fakes, reals = tree_leaves(fake_out), tree_leaves(real_out)
        if len(fakes) != len(reals):
            return
        for f, r in zip(fakes, reals):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor):
                self.set(f, r)


def balanced_topk(shape: tuple[int, ...], k: int, n: int, dim: int) -> Any:
    """``topk`` indices of the given output shape that spread rows evenly over ``n`` choices."""
    import torch

    dim = dim % len(shape)
    moved = [s for i, s in enumerate(shape) if i != dim]
    rows = 1
    for s in moved:
        rows *= s
    picks = (torch.arange(rows).unsqueeze(1) * k + torch.arange(k).unsqueeze(0)) % n
    return picks.reshape(*moved, k).movedim(-1, dim).contiguous()


def collective_shadow(kind: str, real_in: Any, group_size: int, group_rank: int,
                      splits: tuple[list[int], list[int]] | None = None, op: str = "sum") -> Any:
    """What a collective leaves in its output when every rank holds ``real_in``."""
    import torch

    if kind == "all_gather":
        return torch.cat([real_in.reshape(-1)] * group_size)
    if kind == "all_reduce":
        return real_in * group_size if op == "sum" else real_in.clone()
    if kind == "all_to_all":
        out_splits, in_splits = splits or ([], [])
        flat = real_in
        if in_splits:
            chunk = torch.split(flat, in_splits)[group_rank]
        else:
            chunk = torch.chunk(flat, group_size)[group_rank]
        return torch.cat([chunk] * group_size)
    raise ValueError(kind)
