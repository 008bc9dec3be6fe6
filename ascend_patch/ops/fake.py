"""Whether a tensor is fake (``check --memory``'s estimate): shapes, dtypes and storages, no values.

An op that writes its result into rows or channels of an output it has just allocated (the cpu
grouped GEMM's per-group products, the rotary embedding's four half-width products), or adds it
into a buffer it holds (the grouped GEMM's weight gradients into ``main_grad``), allocates nothing
more while writing; on fake tensors it computes nothing either. Such ops skip the writing on fake
tensors (keeping the largest of any per-group temporaries, the loop's peak): the estimate dispatches every op through three Python modes (its memory
tracker, the value-answering mode, ``FakeTensorMode``), and these loops were a third of an MoE
layer's cost there. The allocations, and so the tracked memory, are the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_fake"]


def is_fake(t: Any) -> bool:
    """``t`` is a ``FakeTensor``."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
