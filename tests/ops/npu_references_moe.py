"""REFERENCE implementations of torch_npu's MoE token permutation kernels, for tests only.

Not torch_npu, never run against an NPU: ``npu_moe_token_permute`` / ``npu_moe_token_unpermute`` as
the torch_npu / op-plugin documentation describes them (formulas, dtypes, limits), strict about
arguments outside that contract, differentiable through torch's own ops. Tests inject them into a
backend's kernel table with ``backend.kernels.override(...)``, as :mod:`npu_references`' kernels.
"""

from __future__ import annotations

import torch

__all__ = ["reference_npu_moe_token_permute", "reference_npu_moe_token_unpermute"]


_MOE_LIMIT = 16777215  # documented: fewer indices than this, values in [0, this)
_MOE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def reference_npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """REFERENCE npu_moe_token_permute: (permuted_tokens, sorted_indices int32), differentiable in ``tokens``.

    tokens [T, H] float16/bfloat16/float32; indices [T, topk] (or [T]: topk 1) int32/int64, values in
    [0, 16777215), fewer than 16777215 of them, topk <= 512. first = argsort(flatten(indices)) (stable),
    sorted_indices = argsort(first), permuted[sorted_indices[i]] = tokens[i // topk]; only the first
    num_out_tokens rows are kept (None or 0: all). padded_mode=True is not supported.
    """
    if padded_mode:
        raise ValueError("npu_moe_token_permute: padded_mode=True is not supported")
    if tokens.dim() != 2 or tokens.dtype not in _MOE_DTYPES:
        raise TypeError(f"tokens must be 2-D float16/bfloat16/float32, got {tuple(tokens.shape)} {tokens.dtype}")
    if indices.dtype not in (torch.int32, torch.int64) or indices.dim() not in (1, 2):
        raise TypeError(f"indices must be 1-D or 2-D int32/int64, got {tuple(indices.shape)} {indices.dtype}")
    if indices.shape[0] != tokens.shape[0]:
        raise ValueError(f"indices cover {indices.shape[0]} tokens, tokens has {tokens.shape[0]}")
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    if topk > 512:
        raise ValueError(f"topk {topk} > 512")
    flat = indices.reshape(-1).long()
    if flat.numel() >= _MOE_LIMIT or (flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= _MOE_LIMIT)):
        raise ValueError("indices: fewer than 16777215 values in [0, 16777215)")
    if num_out_tokens is not None and not isinstance(num_out_tokens, int):
        raise TypeError(f"num_out_tokens is an int or None, got {type(num_out_tokens).__name__}")
    first = torch.argsort(flat, stable=True)
    sorted_indices = torch.argsort(first, stable=True).to(torch.int32)
    kept = first if not num_out_tokens else first[:num_out_tokens]
    return tokens.index_select(0, kept // topk), sorted_indices


def reference_npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                                      restore_shape=None):
    """REFERENCE npu_moe_token_unpermute: out[t] = sum_j permuted[sorted_indices[t*topk + j]] * probs[t, j].

    permuted_tokens [T*topk, H] float16/bfloat16/float32, sorted_indices [T*topk] int32 without
    repeats, probs [T, topk] float16/bfloat16/float32 or None (then topk is 1: a pure gather).
    padded_mode=True and restore_shape are not supported. Differentiable in the tokens and probs.
    """
    if padded_mode or restore_shape is not None:
        raise ValueError("npu_moe_token_unpermute: only padded_mode=False, restore_shape=None")
    if permuted_tokens.dim() != 2 or permuted_tokens.dtype not in _MOE_DTYPES:
        raise TypeError(f"permuted_tokens must be 2-D float16/bfloat16/float32, got {permuted_tokens.dtype}")
    if sorted_indices.dtype != torch.int32 or sorted_indices.dim() != 1:
        raise TypeError(f"sorted_indices must be 1-D int32, got {tuple(sorted_indices.shape)} {sorted_indices.dtype}")
    if sorted_indices.numel() != permuted_tokens.shape[0]:
        raise ValueError(f"{sorted_indices.numel()} sorted_indices for {permuted_tokens.shape[0]} permuted rows")
    if torch.unique(sorted_indices).numel() != sorted_indices.numel():
        raise ValueError("sorted_indices must not repeat")
    picked = permuted_tokens.index_select(0, sorted_indices.long())
    if probs is None:
        return picked
    if probs.dim() != 2 or probs.dtype not in _MOE_DTYPES or probs.numel() != sorted_indices.numel():
        raise ValueError(f"probs must be [tokens, topk] float16/bfloat16/float32 covering every index, got "
                         f"{tuple(probs.shape)} {probs.dtype}")
    if probs.dtype != permuted_tokens.dtype:
        raise TypeError(f"this reference takes probs in the tokens' dtype ({permuted_tokens.dtype}), got {probs.dtype}")
    if probs.shape[1] > 512:
        raise ValueError(f"topk {probs.shape[1]} > 512")
    tokens, topk = probs.shape
    return (picked.view(tokens, topk, -1) * probs.unsqueeze(-1)).sum(dim=1)
