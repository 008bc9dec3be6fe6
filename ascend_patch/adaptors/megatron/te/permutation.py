"""``transformer_engine.pytorch.permutation``: the MoE token permutations behind ``--moe-permute-fusion``.

megatron-core 0.16's token dispatchers call them instead of ``moe_utils.permute`` / ``unpermute`` /
``sort_chunks_by_idxs``; torch index ops with megatron's arithmetic, so a run with the flag equals the run without.
"""

from __future__ import annotations

from typing import Any

import torch

from ....backend import current_target
from . import permutation_npu as npu
from ._common import refuse

__all__ = ["moe_permute", "moe_permute_with_probs", "moe_sort_chunks_by_index",
           "moe_sort_chunks_by_index_with_probs", "moe_unpermute"]


def _check_map_type(api: str, map_type: str) -> None:
    # TE's "mask" map type is what megatron uses: routing_map is a [tokens, experts] boolean mask
    if map_type != "mask":
        raise refuse(api, f"map_type={map_type!r}", "only the 'mask' routing map megatron-core uses is implemented",
                     "pass a [tokens, experts] boolean routing_map with map_type='mask'")


def _expert_major(routing_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask [experts, tokens], token of each permuted row, expert of each permuted row)."""
    mask = routing_map.bool().T.contiguous()
    experts, tokens = mask.shape
    token_ids = torch.arange(tokens, device=mask.device).unsqueeze(0).expand(experts, -1).masked_select(mask)
    expert_ids = torch.arange(experts, device=mask.device).unsqueeze(1).expand(-1, tokens).masked_select(mask)
    return mask, token_ids, expert_ids


def _row_id_map(routing_map: torch.Tensor, token_ids: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """The ``row_id_map`` of the torch path: ``[tokens, experts]`` int64, the permuted row of each (token, expert)
    pair or -1, so unpermuting knows each row's token and expert (for the merging probabilities) and the number
    of tokens. It is opaque to megatron (stored and passed back); the npu kernels' is ``[2, tokens, topk]`` int32
    (:mod:`.permutation_npu`)."""
    rows = torch.full(routing_map.shape, -1, dtype=torch.int64, device=routing_map.device)
    rows[token_ids, expert_ids] = torch.arange(token_ids.numel(), device=routing_map.device)
    return rows




def moe_permute(inp: torch.Tensor, routing_map: torch.Tensor, num_out_tokens: Any = -1, max_token_num: int = -1,
                map_type: str = "mask") -> tuple[torch.Tensor, torch.Tensor]:
    """Group ``inp``'s rows ``[tokens, hidden]`` by expert; returns ``(permuted, row_id_map)``.

    Rows are grouped by expert, tokens in their original order within an expert (megatron's unfused
    order, which the grouped GEMM's ``tokens_per_expert`` splits rely on). ``num_out_tokens`` is the
    number of selected (token, expert) pairs megatron computed; the routing map already holds exactly
    those (dropped tokens are cleared, padded ones set). The current target's ``npu_moe_token_permute`` /
    ``npu_moe_token_unpermute`` run where their documented limits hold (every token routed to the same
    number of experts, float16 / bfloat16 / float32; :mod:`.permutation_npu` records why it stepped aside
    elsewhere); else index_select / masked_select / scatter_add, differentiable by autograd. The chunk
    sorts have no torch_npu kernel and stay split / cat on both targets.
    """
    _check_map_type("permutation.moe_permute", map_type)
    fused = npu.permute(current_target().kernels, inp, routing_map, None, num_out_tokens, "moe_permute")
    if fused is not None:
        return fused[0], fused[2]
    _, token_ids, expert_ids = _expert_major(routing_map)
    return inp.index_select(0, token_ids), _row_id_map(routing_map, token_ids, expert_ids)


def moe_permute_with_probs(inp: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor,
                           num_out_tokens: Any = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`moe_permute` that also permutes ``probs`` ``[tokens, experts]``: ``(permuted, probs, row_id_map)``."""
    fused = npu.permute(current_target().kernels, inp, routing_map, probs, num_out_tokens, "moe_permute_with_probs")
    if fused is not None:
        return fused  # type: ignore[return-value]  (probs given: permuted probs are a tensor)
    mask, token_ids, expert_ids = _expert_major(routing_map)
    permuted_probs = probs.T.contiguous().masked_select(mask)
    return inp.index_select(0, token_ids), permuted_probs, _row_id_map(routing_map, token_ids, expert_ids)


def moe_unpermute(inp: torch.Tensor, row_id_map: torch.Tensor, merging_probs: torch.Tensor | None = None,
                  restore_shape: Any = None, map_type: str = "mask",
                  probs: torch.Tensor | None = None) -> torch.Tensor:
    """Sum each token's permuted rows back into place, weighted by ``merging_probs[token, expert]`` if given."""
    _check_map_type("permutation.moe_unpermute", map_type)
    if merging_probs is None:
        merging_probs = probs  # TE's older name of the argument
    if npu.is_kernel_map(row_id_map):  # made by the kernel: only its own layout undoes it
        return npu.unpermute(current_target().kernels, inp, row_id_map, merging_probs, restore_shape)
    tokens, _ = row_id_map.shape
    _, token_ids, expert_ids = _expert_major(row_id_map >= 0)  # rows were numbered in this order
    hidden = inp.shape[-1]
    if restore_shape is None:
        restore_shape = (tokens, hidden)
    out_dtype = inp.dtype
    if merging_probs is not None:
        # as megatron's unpermute: the product takes the probabilities' (possibly wider) dtype
        inp = inp * merging_probs.T.contiguous().masked_select((row_id_map >= 0).T).unsqueeze(-1)
    out = torch.zeros(tuple(restore_shape), dtype=inp.dtype, device=inp.device)
    if torch.are_deterministic_algorithms_enabled():
        out.index_add_(0, token_ids, inp)
    else:
        out.scatter_add_(0, token_ids.unsqueeze(1).expand(-1, hidden), inp)
    return out.to(out_dtype)


def _chunks_in_order(tensor: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor) -> torch.Tensor:
    chunks = torch.split(tensor, [int(n) for n in split_sizes.tolist()], dim=0)
    return torch.cat([chunks[i] for i in sorted_index.tolist()], dim=0)


def moe_sort_chunks_by_index(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor) -> torch.Tensor:
    """Split ``inp`` into chunks of ``split_sizes`` rows and concatenate them in ``sorted_index`` order."""
    return _chunks_in_order(inp, split_sizes, sorted_index)


def moe_sort_chunks_by_index_with_probs(inp: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor,
                                        sorted_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moe_sort_chunks_by_index` of ``inp`` and of the per-row ``probs`` alike."""
    return _chunks_in_order(inp, split_sizes, sorted_index), _chunks_in_order(probs, split_sizes, sorted_index)
