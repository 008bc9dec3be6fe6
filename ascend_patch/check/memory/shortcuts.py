"""Megatron functions the estimate runs as their allocations alone, when their tensors are fake.

Megatron's alltoall dispatcher reorders the tokens it received by local expert with
``sort_chunks_by_idxs``: one ``split`` into experts x ranks chunks and one ``cat`` of them in a
new order, for the tokens and again for their probabilities, twice per MoE layer and pass.
On fake tensors each of those hundreds of views is dispatched through every mode of the
estimate (a fifth of Qwen3-30B-A3B's estimate). Memory-wise the pair is one allocation of the
input's size forward (``cat``) and one backward (``split``'s backward concatenates the
gradient's views); :func:`sort_chunks_by_idxs` makes exactly those, and the truth tests
compare it with real runs of the original.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ...ops.fake import is_fake
from .megatron_names import FAKE_SHORTCUTS

__all__ = ["fake_shortcuts", "sort_chunks_by_idxs"]


_REORDERED: Any = None


def _reordered(t: Any) -> Any:
    """A new tensor of ``t``'s size whose gradient is a new tensor of the gradient's size, as split + cat give."""
    global _REORDERED
    if _REORDERED is None:
        import torch

        class Reordered(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: Any) -> Any:
                return x.new_empty(x.shape)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad.new_empty(grad.shape)

        _REORDERED = Reordered
    return _REORDERED.apply(t)


def sort_chunks_by_idxs(original: Any) -> Any:
    """``original`` (Megatron's ``sort_chunks_by_idxs``), as its allocations alone on fake tensors."""

    def sort(input: Any, split_sizes: Any, sorted_idxs: Any, probs: Any = None, fused: bool = False) -> Any:
        if fused or not is_fake(input) or (probs is not None and not is_fake(probs)):
            return original(input, split_sizes, sorted_idxs, probs=probs, fused=fused)
        return _reordered(input), (_reordered(probs) if probs is not None else None)

    return sort


_MAKERS = {"sort_chunks_by_idxs": sort_chunks_by_idxs}  # FAKE_SHORTCUTS' name -> its shortcut's maker


@contextlib.contextmanager
def fake_shortcuts() -> Iterator[None]:
    """While inside, the names of :data:`FAKE_SHORTCUTS` in modules the launch imported are shortcut."""
    replaced = []
    for module_name, name in FAKE_SHORTCUTS:
        module = sys.modules.get(module_name)  # imported by the launch's model code, or not used by it
        original = getattr(module, name, None)
        if original is not None:
            replaced.append((module, name, original))
            setattr(module, name, _MAKERS[name](original))
    try:
        yield
    finally:
        for module, name, original in replaced:
            setattr(module, name, original)
