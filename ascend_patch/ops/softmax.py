"""Fused scale-mask-softmax on the target, with the CUDA ``scaled_masked_softmax`` kernels' semantics."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..backend import current_target

__all__ = ["npu_softmax_shape_ok", "scaled_masked_softmax", "softmax_kernel"]

_MASK_VALUE = -10000.0


def softmax_kernel() -> Any:
    """The target's fused softmax kernel, or None (the torch path)."""
    return current_target().kernels.get("npu_scaled_masked_softmax")


_TRIANGLES: dict[tuple[int, int, str], Tensor] = {}


def _upper_triangle(sq: int, sk: int, device: torch.device) -> Tensor:
    key = (sq, sk, str(device))
    tri = _TRIANGLES.get(key)
    if tri is None:
        if len(_TRIANGLES) > 32:
            _TRIANGLES.clear()
        tri = _TRIANGLES[key] = torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)
    return tri


def npu_softmax_shape_ok(sq: int, sk: int) -> bool:
    """npu_scaled_masked_softmax's documented limits on the last two dims."""
    return all(32 <= n <= 4096 and n % 32 == 0 for n in (sq, sk))


def scaled_masked_softmax(x: Tensor, mask: Tensor | None, scale: float = 1.0, *, causal: bool = False) -> Tensor:
    """``softmax(x * scale)`` over the last dim with ``mask`` (True = masked) and/or the causal triangle.

    The CUDA kernels' semantics: masked scores filled with -10000, softmax in fp32, a fully masked row
    gives zeros, output in the input dtype. npu: ``npu_scaled_masked_softmax(x, mask, scale,
    fixed_triu_mask=False)`` within its shape limits (:func:`npu_softmax_shape_ok`), else torch.
    """
    sq, sk = x.shape[-2], x.shape[-1]
    can_be_empty = mask is not None  # a causal row always keeps its diagonal
    if causal:
        tri = _upper_triangle(sq, sk, x.device)
        mask = tri if mask is None else (mask.bool() | tri)
    kernel = softmax_kernel()
    if kernel is not None and x.dim() == 4 and npu_softmax_shape_ok(sq, sk):
        m = mask.bool() if mask is not None else torch.zeros(1, 1, sq, sk, dtype=torch.bool, device=x.device)
        while m.dim() < 4:
            m = m.unsqueeze(0)
        return kernel(x, m, float(scale), False)
    if mask is not None:
        mask = mask.bool()
    if scale != 1.0:
        y = x.float() * scale  # scale in fp32, as the kernels do
        if mask is not None:
            y.masked_fill_(mask, _MASK_VALUE)
        probs = torch.softmax(y, dim=-1)
    else:
        # unscaled: mask in the input dtype (-10000 is exact in fp16/bf16) and let softmax upcast inside
        y = x.masked_fill(mask, _MASK_VALUE) if mask is not None else x
        probs = torch.softmax(y, dim=-1, dtype=torch.float32)
    if can_be_empty:
        empty = mask.all(-1, keepdim=True)
        if bool(empty.any()):
            probs = probs.masked_fill(empty, 0.0)  # the CUDA kernels write zeros for a fully masked row
    return probs.to(x.dtype)
