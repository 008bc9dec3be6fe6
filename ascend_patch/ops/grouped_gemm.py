"""Grouped GEMM: one matmul per group of rows, the expert computation of a Mixture of Experts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..backend import current_target
from .fake import is_fake

__all__ = ["grouped_matmul", "group_sizes"]

KERNEL = "npu_grouped_matmul"


def group_sizes(sizes: Any, groups: int, rows: int) -> list[int]:
    """The group sizes as Python ints, checked against the number of groups and of rows."""
    if isinstance(sizes, Tensor):
        values = [int(v) for v in sizes.reshape(-1).tolist()]
    else:
        values = [int(v) for v in sizes]
    if len(values) != groups:
        raise ValueError(f"grouped matmul: {len(values)} group sizes for {groups} weights; "
                         "pass one size per group (expert)")
    if any(v < 0 for v in values):
        raise ValueError(f"grouped matmul: negative group size in {values}")
    if sum(values) != rows:
        raise ValueError(f"grouped matmul: the group sizes {values} sum to {sum(values)} but the input has "
                         f"{rows} rows; the sizes must cover the input exactly")
    return values


def _stacked(weights: tuple[Tensor, ...]) -> bool:
    return len(weights) == 1 and weights[0].dim() == 3


def _matrix(weights: tuple[Tensor, ...], g: int) -> Tensor:
    return weights[0][g] if _stacked(weights) else weights[g]


class _GroupedMatmul(torch.autograd.Function):
    """npu: ``torch_npu.npu_grouped_matmul`` in single-tensor mode (``split_item=3``, group sizes as an int64
    tensor with ``group_list_type=1``): the forward and the input gradient group the M axis (``group_type=0``,
    the weight passed transposed for the input gradient), the weight gradient groups the K axis
    (``group_type=2``, x transposed), which returns the G weight gradients stacked.

    cpu: a loop over the non-empty groups, each one ``torch.mm`` writing straight into its rows of one
    preallocated output (no per-group outputs to concatenate, no split of the input); the weight gradients
    likewise. Empty groups cost nothing and get a zero weight gradient.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, sizes: list[int], trans_b: bool, kernel: Any, accumulate: bool,
                *weights: Tensor) -> Tensor:
        ctx.sizes, ctx.trans_b, ctx.kernel, ctx.accumulate = sizes, trans_b, kernel, accumulate
        if kernel is not None:
            x = x.contiguous()  # the kernel takes x untransposed, and its transpose for the weight gradient
        ctx.save_for_backward(x, *weights)
        first = _matrix(weights, 0)
        n = first.shape[0] if trans_b else first.shape[1]
        if x.shape[0] == 0:
            return x.new_empty(0, n)
        if kernel is not None:
            w = _npu_weights(weights, transpose=trans_b)
            return kernel([x], w, group_list=_group_list(sizes, x), split_item=3, group_type=0,
                          group_list_type=1)[0]
        out = x.new_empty(x.shape[0], n)
        if is_fake(out):
            return out
        start = 0
        for g, size in enumerate(sizes):
            if size:
                w = _matrix(weights, g)
                torch.mm(x[start:start + size], w.t() if trans_b else w, out=out[start:start + size])
                start += size
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        x, *weights = ctx.saved_tensors
        weights = tuple(weights)
        sizes, trans_b, kernel = ctx.sizes, ctx.trans_b, ctx.kernel
        grad = grad.contiguous()
        need_x = ctx.needs_input_grad[0]
        need_w = any(ctx.needs_input_grad[5:])
        dx = None
        if need_x:
            k = _matrix(weights, 0).shape[1] if trans_b else _matrix(weights, 0).shape[0]
            if x.shape[0] == 0:
                dx = x.new_zeros(0, k)
            elif kernel is not None:
                dx = kernel([grad], _npu_weights(weights, transpose=not trans_b), group_list=_group_list(sizes, x),
                            split_item=3, group_type=0, group_list_type=1)[0]
            else:
                dx = x.new_empty(x.shape[0], k)
                start = 0
                for g, size in enumerate(sizes if not is_fake(dx) else ()):
                    if size:
                        w = _matrix(weights, g)
                        torch.mm(grad[start:start + size], w if trans_b else w.t(), out=dx[start:start + size])
                        start += size
        dws: tuple[Any, ...] = (None,) * len(weights)
        if need_w:
            dws = _weight_grads(x, grad, weights, sizes, trans_b, kernel, ctx.accumulate)
        return (dx, None, None, None, None, *dws)


def _weight_grads(x: Tensor, grad: Tensor, weights: tuple[Tensor, ...], sizes: list[int], trans_b: bool,
                  kernel: Any, accumulate: bool) -> tuple[Any, ...]:
    stacked = _stacked(weights)
    if kernel is not None and x.shape[0]:
        # K-axis grouping: [K, M_g] @ [M_g, N] for each group g of M -> [G, K, N] (x passed transposed)
        lhs, rhs = (grad, x) if trans_b else (x, grad)
        per_group = kernel([lhs.t()], [rhs], group_list=_group_list(sizes, x), split_item=3, group_type=2,
                           group_list_type=1)[0]
        if not accumulate:
            return (per_group,) if stacked else tuple(per_group.unbind(0))
        if stacked:
            weights[0].main_grad.add_(per_group.to(weights[0].main_grad.dtype))
        else:
            for w, dw in zip(weights, per_group.unbind(0)):
                w.main_grad.add_(dw.to(w.main_grad.dtype))
        return _dummy_grads(weights)
    shape = weights[0].shape[1:] if stacked else weights[0].shape  # one group's weight
    out = None if accumulate else x.new_empty(len(sizes), *shape)
    fake = is_fake(x)  # the writes compute nothing; the largest group's casts are the loop's only allocations
    largest = max(range(len(sizes)), key=lambda g: sizes[g]) if sizes else -1
    start = 0
    for g, size in enumerate(sizes):
        if fake and (out is not None or g != largest):
            start += size
            continue
        if not size:
            if out is not None:
                out[g].zero_()
            continue
        xs, gs = x[start:start + size], grad[start:start + size]
        lhs, rhs = (gs, xs) if trans_b else (xs, gs)  # dW_g = lhs^T @ rhs
        start += size
        if out is not None:
            torch.mm(lhs.t(), rhs, out=out[g])
            continue
        target = weights[0].main_grad[g] if stacked else weights[g].main_grad
        if target.dtype != lhs.dtype:  # an fp32 main_grad accumulates 16-bit products in fp32
            lhs, rhs = lhs.to(target.dtype), rhs.to(target.dtype)
        if not fake:
            target.addmm_(lhs.t(), rhs)
    if out is None:
        return _dummy_grads(weights)
    return (out,) if stacked else tuple(out.unbind(0))


def _dummy_grads(weights: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """What megatron's linear layers return under gradient_accumulation_fusion: the gradient is in
    main_grad already; an (unread) tensor keeps DDP's hook on the main backward thread."""
    out = []
    for w in weights:
        if hasattr(w, "grad_added_to_main_grad"):
            w.grad_added_to_main_grad = True
            zero = getattr(w, "zero_out_wgrad", False)
            out.append((torch.zeros if zero else torch.empty)(w.shape, dtype=w.dtype, device=w.device))
        else:
            out.append(None)
    return tuple(out)


# npu_grouped_matmul takes a list of weights (one per group) in bf16/fp16 and for at most this many
# groups; fp32, or more groups, only as one stacked [G, K, N] tensor
_LIST_LIMIT = 128


def _npu_weights(weights: tuple[Tensor, ...], transpose: bool) -> list[Tensor]:
    # transposed weights go in as views: the kernel takes them transposed as they are
    if not _stacked(weights) and (weights[0].dtype == torch.float32 or len(weights) > _LIST_LIMIT):
        weights = (torch.stack(weights),)  # a copy per call: the documented cases leave no other way
    if _stacked(weights):
        return [weights[0].transpose(1, 2) if transpose else weights[0]]
    return [w.t() if transpose else w for w in weights]


def _group_list(sizes: list[int], x: Tensor) -> Tensor:
    return torch.tensor(sizes, dtype=torch.int64, device=x.device)


def grouped_matmul(x: Tensor, weights: Tensor | Sequence[Tensor], sizes: Any, *, trans_b: bool = False,
                   accumulate_wgrad: bool = False) -> Tensor:
    """``x[rows of g] @ W_g`` for each group g, differentiable; returns ``[M, N]``.

    ``x`` is ``[M, K]``, the tokens of every group one after the other (``sizes[g]`` rows for group
    g, as megatron's token dispatchers lay them out); ``weights`` a stacked ``[G, K, N]`` tensor (the
    ``grouped_gemm`` package's form, megatron's ``GroupedMLP``) or G ``[K, N]`` matrices (TE's
    ``GroupedLinear`` keeps one parameter per group), ``[.., N, K]`` with ``trans_b``; ``sizes`` the G
    group sizes (ints or an integer tensor) summing to M. ``accumulate_wgrad`` serves megatron's
    ``gradient_accumulation_fusion``: the weight gradients are added into each weight's ``main_grad``
    (in place) instead of being returned, as TE's fused weight-gradient accumulation does.
    """
    ws = (weights,) if isinstance(weights, Tensor) else tuple(weights)
    if isinstance(weights, Tensor) and weights.dim() != 3:
        raise ValueError(f"grouped matmul: a stacked weight must be 3-D [groups, K, N], got {tuple(weights.shape)}")
    if not ws:
        raise ValueError("grouped matmul: no weights")
    if x.dim() != 2:
        raise ValueError(f"grouped matmul: x must be 2-D [tokens, features], got {tuple(x.shape)}")
    groups = ws[0].shape[0] if _stacked(ws) else len(ws)
    first = _matrix(ws, 0)
    k = first.shape[1] if trans_b else first.shape[0]
    if x.shape[1] != k:
        raise ValueError(f"grouped matmul: x has {x.shape[1]} features but each weight is {tuple(first.shape)}"
                         f"{' (trans_b)' if trans_b else ''}, which takes {k}")
    if any(w.dtype != x.dtype for w in ws):
        raise ValueError(f"grouped matmul: x is {x.dtype} but the weights are {ws[0].dtype}; cast one of them")
    values = group_sizes(sizes, groups, x.shape[0])
    kernel = current_target().kernels.get(KERNEL)
    return _GroupedMatmul.apply(x, values, trans_b, kernel, accumulate_wgrad, *ws)
