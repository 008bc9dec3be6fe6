"""``transformer_engine.pytorch.LayerNorm`` / ``RMSNorm`` on the target, and the norm LayerNormLinear applies."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ....backend import current_target
from ....ops import norm as ops_norm
from ._common import target_device

__all__ = ["LayerNorm", "RMSNorm", "apply_norm", "norm_parameters"]

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def apply_norm(x: Tensor, kind: str, weight: Tensor, bias: Tensor | None, eps: float,
               zero_centered_gamma: bool) -> Tensor:
    """``kind`` ("LayerNorm" / "RMSNorm") of ``x`` over its last dim, output in ``x``'s dtype.

    RMS norm runs ``npu_rms_norm`` when the current target's kernel table has it
    (:func:`ascend_patch.ops.norm.rms_norm`), else torch's ``rms_norm`` - the function megatron's local
    spec reaches through ``torch.nn.RMSNorm`` on cpu, so the two ``--transformer-impl`` choices compute
    the same numbers. Layer norm is torch's fused ``layer_norm`` on both targets.
    """
    gamma = weight + 1 if zero_centered_gamma else weight
    shape = (x.shape[-1],)
    if kind == "RMSNorm":
        if gamma.dtype == x.dtype and current_target().kernels.get("npu_rms_norm") is None:
            return F.rms_norm(x, shape, gamma, eps)
        return ops_norm.rms_norm(x, shape, gamma, eps)
    return ops_norm.layer_norm(x, shape, gamma, bias, eps)


def norm_parameters(module: torch.nn.Module, kind: str, hidden_size: int, *, prefix: str, zero_centered_gamma: bool,
                    sequence_parallel: bool, dtype: torch.dtype | None, device: Any) -> None:
    """Register ``{prefix}weight`` (and ``{prefix}bias`` for LayerNorm) on ``module``, initialised as TE does.

    TE's semantics: ``zero_centered_gamma`` stores gamma - 1 (initialised to zeros, applied as
    ``1 + weight``); under ``sequence_parallel`` every parameter is tagged ``sequence_parallel=True`` so
    megatron's ``finalize_model_grads`` all-reduces its partial gradient over the TP group (the norm sees
    only the local sequence shard).
    """
    if kind not in NORMALIZATIONS:
        raise ValueError(f"normalization={kind!r} is not supported by the transformer_engine layer; use "
                         f"{' or '.join(NORMALIZATIONS)} (--normalization)")
    dtype = dtype or torch.get_default_dtype()
    fill = 0.0 if zero_centered_gamma else 1.0
    weight = torch.nn.Parameter(torch.full((hidden_size,), fill, dtype=dtype, device=device))
    module.register_parameter(f"{prefix}weight", weight)
    bias = None
    if kind == "LayerNorm":
        bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))
        module.register_parameter(f"{prefix}bias", bias)
    else:
        setattr(module, f"{prefix}bias", None)
    for param in (weight, bias):
        if param is not None:
            param.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]


class _Norm(torch.nn.Module):
    kind = "LayerNorm"

    def __init__(self, normalized_shape: int | None = None, eps: float = 1e-5, sequence_parallel: bool | None = None,
                 params_dtype: torch.dtype | None = None, zero_centered_gamma: bool = False,
                 device: Any = None, *, hidden_size: int | None = None, sm_margin: int = 0) -> None:
        super().__init__()
        size = normalized_shape if normalized_shape is not None else hidden_size
        if isinstance(size, (tuple, list, torch.Size)):
            if len(size) != 1:
                raise ValueError(f"transformer_engine.pytorch.{self.kind} normalises the last dimension only; got "
                                 f"normalized_shape={tuple(size)}")
            size = size[0]
        if size is None:
            raise TypeError(f"transformer_engine.pytorch.{self.kind} needs normalized_shape (or hidden_size)")
        self.normalized_shape = (int(size),)
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self.sequence_parallel = bool(sequence_parallel)
        norm_parameters(self, self.kind, int(size), prefix="", zero_centered_gamma=zero_centered_gamma,
                        sequence_parallel=self.sequence_parallel, dtype=params_dtype,
                        device=target_device(device))

    def forward(self, inp: Tensor) -> Tensor:
        return apply_norm(inp, self.kind, self.weight, self.bias, self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """TE's ``LayerNorm(hidden_size, eps, sequence_parallel, params_dtype, zero_centered_gamma, device)``."""

    kind = "LayerNorm"


class RMSNorm(_Norm):
    """TE's ``RMSNorm(hidden_size, eps, sequence_parallel, params_dtype, zero_centered_gamma, device)``."""

    kind = "RMSNorm"
