"""``transformer_engine.pytorch.router``: the fused MoE routing behind ``--moe-router-fusion`` (TE >= 2.7).

megatron-core 0.16 imports ``fused_topk_with_score_function``,
``fused_compute_score_for_moe_aux_loss`` and ``fused_moe_aux_loss`` from here when TE reports
2.7 or later, and with ``--moe-router-fusion`` its router calls them instead of
``moe_utils.topk_routing_with_score_function``, ``compute_routing_scores_for_aux_loss`` and
``switch_load_balancing_loss_func``. These are the same computations in torch ops (softmax or
sigmoid scores, optional pre-softmax, expert bias for selection only, group-limited top-k,
scaling), differentiable by autograd, on any device: a run with the flag routes and balances
exactly as the run without.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_topk_with_score_function"]


def _topk(scores: torch.Tensor, topk: int, num_groups: int | None, group_topk: int | None) -> tuple[Any, Any]:
    """(values, indices) of the top ``topk`` experts, within the best ``group_topk`` groups if given."""
    if not group_topk:
        return torch.topk(scores, k=topk, dim=1)
    tokens, experts = scores.shape
    groups = int(num_groups)
    # a group's score: the sum of its best topk/group_topk experts
    group_scores = scores.view(tokens, groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
    chosen = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    allowed = torch.zeros_like(group_scores).scatter_(1, chosen, 1).bool()
    allowed = allowed.unsqueeze(-1).expand(tokens, groups, experts // groups).reshape(tokens, experts)
    return torch.topk(scores.masked_fill(~allowed, float("-inf")), k=topk, dim=1)


def _dense(logits: torch.Tensor, indices: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    routing_probs = torch.zeros_like(logits).scatter(1, indices, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, indices, True)
    return routing_probs, routing_map


def fused_topk_with_score_function(logits: torch.Tensor, topk: int, use_pre_softmax: bool = False,
                                   num_groups: int | None = None, group_topk: int | None = None,
                                   scaling_factor: float | None = None, score_function: str = "softmax",
                                   expert_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of ``logits`` ``[tokens, experts]``: ``(probs [tokens, experts], routing_map)``."""
    if score_function == "softmax":
        if use_pre_softmax:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits)
            probs, indices = _topk(scores, topk, num_groups, group_topk)
        else:
            top, indices = _topk(logits, topk, num_groups, group_topk)
            probs = torch.softmax(top, dim=-1, dtype=torch.float32).type_as(logits)
    elif score_function == "sigmoid":
        scores = torch.sigmoid(logits.float()).type_as(logits)
        if expert_bias is not None:  # the bias steers the choice only; the weights are the unbiased scores
            _, indices = _topk(scores + expert_bias, topk, num_groups, group_topk)
            top = torch.gather(scores, dim=1, index=indices).type_as(logits)
        else:
            top, indices = _topk(scores, topk, num_groups, group_topk)
        probs = top / (top.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else top
    else:
        raise ValueError(f"score_function={score_function!r}: the router supports 'softmax' and 'sigmoid'")
    if scaling_factor:
        probs = probs * scaling_factor
    return _dense(logits, indices, probs)


def fused_compute_score_for_moe_aux_loss(logits: torch.Tensor, topk: int,
                                         score_function: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The aux loss's view of routing: ``(routing_map, scores)`` over all experts, no bias, no groups."""
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    elif score_function == "sigmoid":
        scores = torch.sigmoid(logits)
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        raise ValueError(f"score_function={score_function!r}: the router supports 'softmax' and 'sigmoid'")
    indices = torch.topk(scores, k=topk, dim=1)[1]
    return torch.zeros_like(logits, dtype=torch.bool).scatter(1, indices, True), scores


def fused_moe_aux_loss(probs: torch.Tensor, tokens_per_expert: torch.Tensor, total_num_tokens: int,
                       num_experts: int, topk: int, coeff: float) -> torch.Tensor:
    """Switch-Transformer load balancing: E * coeff / (topk * T^2) * sum_e (sum of probs to e) * tokens to e."""
    per_expert = probs.sum(dim=0)
    scale = num_experts * coeff / (topk * total_num_tokens * total_num_tokens)
    return torch.sum(per_expert * tokens_per_expert) * scale
