"""``transformer_engine.pytorch.cross_entropy.parallel_cross_entropy``: ``--cross-entropy-fusion-impl te``.

With ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te`` megatron-core's language
model computes its loss with TE's kernel through
``megatron.core.extensions.transformer_engine.te_parallel_cross_entropy``: logits ``[s, b, V/tp]``
split over the vocabulary across the tensor-parallel group it passes, labels ``[s, b]``, one loss
per token back (``reduce_loss=False``, no label smoothing, TE < 2.7's five-argument call or the
seven-argument one).

This is the same arithmetic as megatron's unfused ``vocab_parallel_cross_entropy`` (max and
sums all-reduced over the group, loss = log(sum exp) - the target's logit, gradient = softmax
minus the one-hot of the target), in fp32, for the group TE is given rather than megatron's
global TP group. Labels equal to ``ignore_idx`` get loss 0 and no gradient, as in TE.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ._common import refuse

__all__ = ["parallel_cross_entropy"]


def _rank_and_size(group: Any) -> tuple[int, int]:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any, size: int) -> None:
    if size > 1:
        dist.all_reduce(tensor, op=op, group=group)


class _ParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any,  # type: ignore[override]
                ignore_idx: int) -> torch.Tensor:
        rank, size = _rank_and_size(group)
        logits32 = logits.float().clone()  # never change the caller's logits
        logits_max = logits32.max(dim=-1).values
        _all_reduce(logits_max, dist.ReduceOp.MAX, group, size)
        logits32 -= logits_max.unsqueeze(-1)

        part = logits32.size(-1)
        start = rank * part
        outside = (target < start) | (target >= start + part)
        local = (target - start).masked_fill(outside, 0)
        predicted = logits32.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _all_reduce(predicted, dist.ReduceOp.SUM, group, size)

        exp = logits32.exp_()
        sum_exp = exp.sum(dim=-1)
        _all_reduce(sum_exp, dist.ReduceOp.SUM, group, size)
        ignored = target == ignore_idx
        loss = (torch.log(sum_exp) - predicted).masked_fill(ignored, 0.0)

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local, ignored)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        softmax, outside, local, ignored = ctx.saved_tensors
        grad = softmax.clone()
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local.unsqueeze(-1), -hit)
        grad.mul_(grad_output.masked_fill(ignored, 0.0).unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


def parallel_cross_entropy(inp: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                           reduce_loss: bool = False, dist_process_group: Any = None, ignore_idx: int = -100,
                           is_cg_capturable: bool = False) -> torch.Tensor:
    """Per-token cross entropy of vocabulary-parallel ``inp`` against ``target`` (fp32, shape of ``target``)."""
    if label_smoothing:
        raise refuse("cross_entropy.parallel_cross_entropy", f"label_smoothing={label_smoothing}",
                     "only the unsmoothed loss megatron-core asks for is implemented",
                     "use megatron's unfused loss (drop --cross-entropy-loss-fusion) for label smoothing")
    if reduce_loss:
        raise refuse("cross_entropy.parallel_cross_entropy", "reduce_loss=True",
                     "only the per-token loss megatron-core asks for is implemented", "reduce the returned losses")
    return _ParallelCrossEntropy.apply(inp, target, dist_process_group, ignore_idx)
