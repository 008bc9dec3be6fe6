"""apex's norm modules (``apex.normalization``, ``apex.contrib.layer_norm``) on :mod:`.norm`'s ops."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import init

from .norm import (
    FastLayerNormFN,
    Shape,
    _autocast_args,
    _shape,
    fused_layer_norm,
    fused_layer_norm_affine,
    fused_rms_norm,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)

__all__ = [
    "FastLayerNorm",
    "FusedLayerNorm",
    "FusedRMSNorm",
    "MixedFusedLayerNorm",
    "MixedFusedRMSNorm",
]


# -- apex's modules -------------------------------------------------------------------------

class FusedLayerNorm(torch.nn.Module):
    """``apex.normalization.FusedLayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False)``."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__()
        self.normalized_shape = torch.Size(_shape(normalized_shape))
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(*self.normalized_shape))
            self.bias = torch.nn.Parameter(torch.empty(*self.normalized_shape))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        if self.elementwise_affine:
            return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                           self.memory_efficient)
        return fused_layer_norm(input, self.normalized_shape, self.eps, self.memory_efficient)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedRMSNorm(torch.nn.Module):
    """``apex.normalization.FusedRMSNorm(normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False)``.

    ``npu_rms_norm`` where the current target has it; state dict key ``weight`` like ``torch.nn.RMSNorm``.
    """

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__()
        self.normalized_shape = torch.Size(_shape(normalized_shape))
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(*self.normalized_shape))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        if self.elementwise_affine:
            return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps, self.memory_efficient)
        return fused_rms_norm(input, self.normalized_shape, self.eps, self.memory_efficient)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def _mixed_init_kwargs(cls: str, kwargs: dict[str, Any]) -> None:
    if "elementwise_affine" in kwargs:
        import warnings

        warnings.warn(f"{cls} does not support `elementwise_affine` argument", stacklevel=3)
        if not kwargs.pop("elementwise_affine"):
            raise RuntimeError(f"{cls} does not support `elementwise_affine = False`")
    if kwargs:
        raise TypeError(f"{cls}() got unexpected keyword arguments {sorted(kwargs)}")


class MixedFusedLayerNorm(FusedLayerNorm):
    """apex's ``MixedFusedLayerNorm``: output in the parameters' dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: Any) -> None:
        _mixed_init_kwargs("MixedFusedLayerNorm", kwargs)
        super().__init__(normalized_shape=normalized_shape, eps=eps, elementwise_affine=True,
                         memory_efficient=memory_efficient)

    def forward(self, input: Tensor) -> Tensor:
        return mixed_dtype_fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                                   self.memory_efficient)


class MixedFusedRMSNorm(FusedRMSNorm):
    """apex's ``MixedFusedRMSNorm``: output in the weight's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: Any) -> None:
        _mixed_init_kwargs("MixedFusedRMSNorm", kwargs)
        super().__init__(normalized_shape=normalized_shape, eps=eps, elementwise_affine=True,
                         memory_efficient=memory_efficient)

    def forward(self, input: Tensor) -> Tensor:
        return mixed_dtype_fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps,
                                                 self.memory_efficient)


class FastLayerNorm(torch.nn.Module):
    """apex.contrib's ``FastLayerNorm(hidden_size, eps=1e-5, memory_efficient=False)``."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, memory_efficient: bool = False) -> None:
        super().__init__()
        self.epsilon = eps
        self.memory_efficient = memory_efficient
        self.weight = torch.nn.Parameter(torch.empty(hidden_size))
        self.bias = torch.nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.ones_(self.weight)
        init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        x, w, b = _autocast_args((x, self.weight, self.bias))
        with torch.autocast(x.device.type, enabled=False):
            return FastLayerNormFN.apply(x, w, b, self.epsilon, self.memory_efficient)
