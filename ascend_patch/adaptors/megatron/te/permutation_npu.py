"""TE's mask-map MoE permutations translated to ``torch_npu.npu_moe_token_permute`` / ``npu_moe_token_unpermute``.

The kernels' documented contract (torch_npu / op-plugin; verified here with reference kernels on
cpu only, never on an NPU):

* ``npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False)
  -> (permuted_tokens, sorted_indices)``: ``tokens`` ``[T, H]`` float16/bfloat16/float32,
  ``indices`` ``[T, topk]`` int32/int64, the experts of each token (values in [0, 16777215),
  fewer than 16777215 elements, topk <= 512). ``first = argsort(flatten(indices))`` (stable),
  ``sorted_indices = argsort(first)`` (int32: the permuted row of each (token, k) pair) and
  ``permuted[sorted_indices[i]] = tokens[i // topk]``, the first ``num_out_tokens`` rows kept.
  ``padded_mode=True`` is not supported.
* ``npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
  restore_shape=None) -> out``: ``out[t] = sum_j permuted[sorted_indices[t * topk + j]] * probs[t, j]``
  with ``probs`` ``[T, topk]``; without ``probs`` topk is 1 and nothing is summed.

Megatron hands TE a ``[T, E]`` boolean routing map. Where every token is routed to the same number
k of experts (top-k routing without token dropping: the alltoall dispatcher's map, the allgather
dispatcher's without expert parallelism) the map is ``indices`` ``[T, k]`` with each token's
experts ascending, and the kernel's order is megatron's (rows grouped by expert, tokens in order
within an expert). Elsewhere (dropped tokens, a dispatcher's local experts, an unsupported dtype)
the plain-torch path runs and the reason is recorded in the migration report's usage table.

Counting the experts of each token costs one small device-to-host copy per permutation; the
plain-torch path's ``masked_select`` synchronizes likewise.

The ``row_id_map`` handed to ``moe_unpermute`` is then an int32 ``[2, T, k]`` tensor (the kernel's
``sorted_indices`` and the experts) where the torch path's is ``[T, E]`` int64; unpermuting tells
them apart by rank. Unpermuting without merging probabilities sums each token's k rows, so the
kernel gets probabilities of one; with them, the ``[T, E]`` probabilities at the token's experts.
Both are cast with the rows to their common dtype, as megatron's unfused ``unpermute`` promotes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["KERNELS", "MAX_INDICES", "MAX_TOPK", "expert_indices", "is_kernel_map", "permute", "unpermute"]

PERMUTE, UNPERMUTE = "npu_moe_token_permute", "npu_moe_token_unpermute"
KERNELS = (PERMUTE, UNPERMUTE)
MAX_TOPK = 512
MAX_INDICES = 16777215  # documented bound on the number of indices and on their values
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_API = "transformer_engine.pytorch.permutation"


def _record(api: str, reason: str, kernel: str = PERMUTE) -> None:
    """The fallback in the migration report's usage table: the API, the kernel not used and why."""
    from .... import usage

    usage.note(f"{_API}.{api}: {kernel} not used ({reason})", "emulated")


def _uniform_topk(routing_map: Tensor) -> tuple[int, str]:
    """(k, "") when every token is routed to exactly k experts, else (0, why not)."""
    counts = routing_map.sum(dim=1)
    low, high = (int(v) for v in torch.stack(torch.aminmax(counts)).tolist())  # one device-to-host copy
    if low != high:
        return 0, (f"tokens are routed to {low} to {high} experts (dropped tokens, or a dispatcher's local "
                   "experts); the kernel takes one top-k for every token")
    if high == 0:
        return 0, "no token is routed to any expert"
    if high > MAX_TOPK:
        return 0, f"top-{high} routing; the kernel takes top-k <= {MAX_TOPK}"
    if routing_map.shape[0] * high >= MAX_INDICES:
        return 0, f"{routing_map.shape[0]} tokens x top-{high} indices; the kernel takes fewer than {MAX_INDICES}"
    return high, ""


def expert_indices(routing_map: Tensor, k: int) -> Tensor:
    """``[T, k]`` int32: the experts of each token, ascending (each row of the map has exactly k)."""
    experts = routing_map.shape[1]
    ids = torch.arange(experts, device=routing_map.device).expand_as(routing_map)
    # unrouted columns sort after every expert; the first k of each row are its experts
    keyed = torch.where(routing_map.bool(), ids, torch.full_like(ids, experts))
    return keyed.sort(dim=1).values[:, :k].to(torch.int32)


def permute(kernels: Any, inp: Tensor, routing_map: Tensor, probs: Tensor | None, num_out_tokens: Any,
            api: str) -> tuple[Tensor, Tensor | None, Tensor] | None:
    """``(permuted, permuted probs or None, row_id_map)`` by the kernel, or None where the torch path must run."""
    kernel = kernels.get(PERMUTE) if kernels is not None else None
    if kernel is None:
        return None
    if kernels.get(UNPERMUTE) is None:
        _record(api, "torch_npu has no npu_moe_token_unpermute to undo it")
        return None
    reason = _unsupported(inp, routing_map, probs)
    k = 0
    if not reason:
        k, reason = _uniform_topk(routing_map)
    tokens = routing_map.shape[0]
    if not reason and num_out_tokens is not None and int(num_out_tokens) not in (-1, tokens * k):
        reason = (f"num_out_tokens={int(num_out_tokens)} but the routing map selects {tokens * k} (token, expert) "
                  "pairs")
    if reason:
        _record(api, reason)
        return None
    indices = expert_indices(routing_map, k)
    permuted, sorted_indices = kernel(inp, indices, num_out_tokens=tokens * k, padded_mode=False)
    rows = sorted_indices.to(torch.int32).view(tokens, k)
    permuted_probs = None
    if probs is not None:
        # each pair's probability goes to the pair's permuted row: megatron's permuted_probs
        chosen = probs.gather(1, indices.long()).reshape(-1)
        permuted_probs = chosen.new_zeros(tokens * k).scatter(0, rows.reshape(-1).long(), chosen)
    return permuted, permuted_probs, torch.stack((rows, indices))


def _unsupported(inp: Tensor, routing_map: Tensor, probs: Tensor | None) -> str:
    if inp.dim() != 2:
        return f"tokens are {inp.dim()}-D; the kernel takes [tokens, hidden]"
    if inp.dtype not in _DTYPES:
        return f"tokens are {inp.dtype}; the kernel takes float16, bfloat16 or float32"
    if probs is not None and probs.dtype not in _DTYPES:
        return f"probs are {probs.dtype}; the kernels take float16, bfloat16 or float32"
    if routing_map.dim() != 2 or routing_map.shape[0] != inp.shape[0]:
        return f"routing map {tuple(routing_map.shape)} for {inp.shape[0]} tokens"
    if routing_map.shape[0] == 0:
        return "no tokens"
    return ""


def is_kernel_map(row_id_map: Tensor) -> bool:
    """Whether ``row_id_map`` came from :func:`permute` (``[2, T, k]``) rather than the torch path (``[T, E]``)."""
    return row_id_map.dim() == 3


def unpermute(kernels: Any, inp: Tensor, row_id_map: Tensor, merging_probs: Tensor | None,
              restore_shape: Any) -> Tensor:
    """Each token's k permuted rows summed back into place (weighted by ``merging_probs[token, expert]``)."""
    rows, experts = row_id_map[0], row_id_map[1]
    tokens, k = rows.shape
    if merging_probs is None:
        weights = torch.ones(tokens, k, dtype=inp.dtype, device=inp.device)
    else:
        weights = merging_probs.gather(1, experts.long())
    dtype = torch.promote_types(inp.dtype, weights.dtype)  # megatron's unfused unpermute promotes likewise
    permuted, weights = inp.to(dtype), weights.to(dtype)
    kernel = kernels.get(UNPERMUTE) if kernels is not None else None
    if kernel is not None and dtype in _DTYPES:
        out = kernel(permuted, rows.reshape(-1), probs=weights, padded_mode=False, restore_shape=None)
    else:
        if kernel is not None:
            _record("moe_unpermute", f"rows times probabilities are {dtype}; the kernel takes float16, bfloat16 "
                                     "or float32", kernel=UNPERMUTE)
        # the map outlived the kernel table it was made with (or a float64 product): the documented formula
        picked = permuted.index_select(0, rows.reshape(-1).long()).view(tokens, k, -1)
        out = (picked * weights.unsqueeze(-1)).sum(dim=1)
    out = out.to(inp.dtype)
    return out if restore_shape is None else out.view(tuple(restore_shape))
