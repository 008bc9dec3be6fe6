"""Layer norm and RMS norm on the target with apex's CUDA semantics: fp32 statistics, output in the input's dtype."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ..backend import current_target

__all__ = [
    "FastLayerNormFN",
    "FusedLayerNormAffineFunction",
    "FusedLayerNormAffineMixedDtypesFunction",
    "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction",
    "FusedRMSNormAffineMixedDtypesFunction",
    "FusedRMSNormFunction",
    "fused_layer_norm",
    "fused_layer_norm_affine",
    "fused_rms_norm",
    "fused_rms_norm_affine",
    "layer_norm",
    "mixed_dtype_fused_layer_norm_affine",
    "mixed_dtype_fused_rms_norm_affine",
    "rms_norm",
]

Shape = Sequence[int] | int | torch.Size


def _shape(normalized_shape: Shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(range(-len(shape), 0))


def _stats_view(x: Tensor, shape: tuple[int, ...], flat: Tensor) -> Tensor:
    return flat.reshape(*x.shape[: x.dim() - len(shape)], *([1] * len(shape)))


def _common(*dtypes: torch.dtype | None) -> torch.dtype:
    out = None
    for dt in dtypes:
        if dt is not None:
            out = dt if out is None else torch.promote_types(out, dt)
    assert out is not None
    return out


def _rms_kernel() -> Any:
    return current_target().kernels.get("npu_rms_norm")


# -- RMS norm -------------------------------------------------------------------------------

def _rms_forward(x: Tensor, shape: tuple[int, ...], weight: Tensor | None, eps: float, out_dtype: torch.dtype,
                 kernel: Any) -> tuple[Tensor, Tensor]:
    """(output, rstd with keepdim shape, fp32) without autograd bookkeeping; ``kernel``: npu_rms_norm or None.

    npu: its gamma must match the input dtype, so both are cast to their common dtype. cpu:
    ``aten._fused_rms_norm`` (with the fp32 analytic backward below, faster than torch's composite
    RMSNorm here).
    """
    c = _common(x.dtype, weight.dtype if weight is not None else None, out_dtype)
    if kernel is not None and 2 <= x.dim() <= 8:
        gamma = weight.to(c) if weight is not None else torch.ones(shape, dtype=c, device=x.device)
        y, rstd = kernel(x.to(c), gamma, epsilon=eps)
        return y.to(out_dtype), _stats_view(x, shape, rstd.reshape(-1).float())
    if x.device.type == "cpu":
        y, rstd = torch.ops.aten._fused_rms_norm(x.to(c), list(shape), None if weight is None else weight.to(c), eps)
        return y.to(out_dtype), rstd.float()
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(_dims(shape), keepdim=True) + eps)
    y = x32 * rstd
    if weight is not None:
        y = y * weight.float()
    return y.to(out_dtype), rstd


def _rms_backward(g: Tensor, x_hat: Tensor, rstd: Tensor, shape: tuple[int, ...], weight: Tensor | None,
                  need_weight_grad: bool) -> tuple[Tensor, Tensor | None]:
    g32 = g.float()
    gw = g32 * weight.float() if weight is not None else g32
    dx = rstd * (gw - x_hat * (gw * x_hat).mean(_dims(shape), keepdim=True))
    dw = (g32 * x_hat).reshape(-1, *shape).sum(0) if need_weight_grad else None
    return dx, dw


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, shape: tuple[int, ...], eps: float,
                out_dtype: torch.dtype) -> Tensor:
        y, rstd = _rms_forward(x, shape, weight, eps, out_dtype, None)
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape = shape
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        x, weight, rstd = ctx.saved_tensors
        need_w = weight is not None and ctx.needs_input_grad[1]
        dx, dw = _rms_backward(g, x.float() * rstd, rstd, ctx.shape, weight, need_w)
        return dx.to(x.dtype), None if dw is None else dw.to(weight.dtype), None, None, None


def rms_norm(x: Tensor, normalized_shape: Shape, weight: Tensor | None = None, eps: float = 1e-6, *,
             out_dtype: torch.dtype | None = None) -> Tensor:
    """RMS norm over the trailing ``normalized_shape`` dims (fp32 statistics), differentiable.

    ``out_dtype`` defaults to ``x.dtype`` (apex's fused kernels; pass ``weight.dtype`` for the
    mixed-dtype variants). npu: ``npu_rms_norm``; cpu: fused forward + analytic backward.
    """
    shape = _shape(normalized_shape)
    out_dtype = out_dtype or x.dtype
    kernel = _rms_kernel()
    if kernel is not None and 2 <= x.dim() <= 8:
        # torch_npu gives npu_rms_norm its own backward, so call it under autograd directly
        c = _common(x.dtype, weight.dtype if weight is not None else None, out_dtype)
        gamma = weight.to(c) if weight is not None else torch.ones(shape, dtype=c, device=x.device)
        return kernel(x.to(c), gamma, epsilon=eps)[0].to(out_dtype)
    return _RMSNormFn.apply(x, weight, shape, float(eps), out_dtype)


# -- layer norm -----------------------------------------------------------------------------

def layer_norm(x: Tensor, normalized_shape: Shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5, *, out_dtype: torch.dtype | None = None) -> Tensor:
    """Layer norm with fp32 statistics, output in ``out_dtype`` (default ``x.dtype``), differentiable.

    The entry point other adaptors (the Megatron norms, the TE layer) call, with :func:`rms_norm`.

    Both targets use torch's native ``layer_norm`` (fused on cpu and, through torch_npu, on npu).
    """
    shape = _shape(normalized_shape)
    out_dtype = out_dtype or x.dtype
    params = {t.dtype for t in (weight, bias) if t is not None}
    if out_dtype == x.dtype and (params <= {x.dtype} or (
            x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16) and params == {torch.float32})):
        return F.layer_norm(x, shape, weight, bias, eps)  # the cpu kernel handles half input + fp32 params
    c = _common(x.dtype, out_dtype, *params)
    return F.layer_norm(x.to(c), shape, None if weight is None else weight.to(c),
                        None if bias is None else bias.to(c), eps).to(out_dtype)


_HALF = (torch.float16, torch.bfloat16)


def _ln_params(x: Tensor, shape: tuple[int, ...], weight: Tensor | None,
               bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """Weight and bias for the native kernel: fp32 for half inputs, so its statistics are fp32 like apex's."""
    dt = torch.float32 if x.dtype in _HALF else x.dtype
    w = weight.to(dt) if weight is not None else torch.ones(shape, dtype=dt, device=x.device)
    b = bias.to(dt) if bias is not None else torch.zeros(shape, dtype=dt, device=x.device)
    return w, b


def _ln_forward(x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float,
                out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    if out_dtype != x.dtype:
        x = x.to(out_dtype)
    w, b = _ln_params(x, shape, weight, bias)
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, list(shape), w, b, eps)
    return out, mean.float(), rstd.float()


def _ln_backward(dout: Tensor, x_or_y: Tensor, mean: Tensor | None, rstd: Tensor, shape: tuple[int, ...],
                 weight: Tensor | None, bias: Tensor | None, memory_efficient: bool,
                 mask: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    w, b = _ln_params(x_or_y, shape, weight, bias)
    stats_dt = w.dtype
    rstd_v = _stats_view(x_or_y, shape, rstd.reshape(-1)).to(stats_dt)
    if memory_efficient:
        # rebuild x - mean from the output, (y - beta) / gamma / rstd, and pass it with mean 0
        y = (x_or_y.to(stats_dt) - b) / w
        x, mean_v = (y / rstd_v).to(x_or_y.dtype), torch.zeros_like(rstd_v)
    else:
        x, mean_v = x_or_y, _stats_view(x_or_y, shape, mean.reshape(-1)).to(stats_dt)
    need = (mask[0], mask[1] and weight is not None, mask[2] and bias is not None)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dout.to(x.dtype).contiguous(), x, list(shape), mean_v,
                                                           rstd_v, w, b, list(need))
    return (dx, None if dw is None or weight is None else dw.to(weight.dtype),
            None if db is None or bias is None else db.to(bias.dtype))


# -- apex's autograd functions --------------------------------------------------------------
# apex's CUDA kernels' semantics: statistics in fp32, output in the input's dtype (the Mixed* variants:
# in the weight's dtype), mean/invvar as flat fp32 tensors of the leading size. memory_efficient
# recomputes the normalised input from the output in backward (it changes memory, not results).

class FusedLayerNormAffineFunction(torch.autograd.Function):
    """apex's ``FusedLayerNormAffineFunction.apply(input, weight, bias, normalized_shape, eps, memory_efficient)``."""

    _mixed = False

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Plain full-precision calls go straight to torch's layer_norm (the same kernels, native backward)."""
        if cls is FusedLayerNormAffineFunction and not kwargs and 5 <= len(args) <= 6:
            input, weight, bias, shape, eps = args[:5]
            efficient = len(args) == 6 and args[5]
            if (not efficient and isinstance(input, Tensor) and isinstance(weight, Tensor)
                    and isinstance(bias, Tensor) and input.dtype == weight.dtype == bias.dtype
                    and input.dtype not in _HALF):
                return F.layer_norm(input, _shape(shape), weight, bias, eps)
        return super().apply(*args, **kwargs)

    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Tensor, normalized_shape: Shape, eps: float,
                memory_efficient: bool = False) -> Tensor:
        shape = _shape(normalized_shape)
        mixed = getattr(ctx, "_forward_cls", FusedLayerNormAffineFunction)._mixed
        # the mixed variant normalises the input cast to the weight dtype (output in that dtype)
        x = input.contiguous().to(weight.dtype) if mixed else input.contiguous()
        out, mean, rstd = _ln_forward(x, shape, weight.contiguous(), bias.contiguous(), eps, x.dtype)
        ctx.shape, ctx.memory_efficient, ctx.in_dtype = shape, memory_efficient, input.dtype
        ctx.save_for_backward(out if memory_efficient else x, weight, bias, None if memory_efficient else mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
        x_or_y, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = _ln_backward(grad_output.to(x_or_y.dtype), x_or_y, mean, rstd, ctx.shape, weight, bias,
                                  ctx.memory_efficient, (True, ctx.needs_input_grad[1], ctx.needs_input_grad[2]))
        return dx.to(ctx.in_dtype), dw, db, None, None, None


class FusedLayerNormAffineMixedDtypesFunction(FusedLayerNormAffineFunction):
    """The mixed variant: output in the weight's dtype."""

    _mixed = True


class FusedLayerNormFunction(torch.autograd.Function):
    """apex's ``FusedLayerNormFunction.apply(input, normalized_shape, eps, memory_efficient)`` (no affine)."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, normalized_shape: Shape, eps: float, memory_efficient: bool = False) -> Tensor:
        shape = _shape(normalized_shape)
        out, mean, rstd = _ln_forward(input.contiguous(), shape, None, None, eps, input.dtype)
        ctx.shape, ctx.memory_efficient = shape, memory_efficient
        ctx.save_for_backward(out if memory_efficient else input, None if memory_efficient else mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
        x_or_y, mean, rstd = ctx.saved_tensors
        dx = _ln_backward(grad_output, x_or_y, mean, rstd, ctx.shape, None, None, ctx.memory_efficient,
                          (True, False, False))[0]
        return dx, None, None, None


class FusedRMSNormAffineFunction(torch.autograd.Function):
    """apex's ``FusedRMSNormAffineFunction.apply(input, weight, normalized_shape, eps, memory_efficient)``."""

    _mixed = False

    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor, normalized_shape: Shape, eps: float,
                memory_efficient: bool = False) -> Tensor:
        shape = _shape(normalized_shape)
        mixed = getattr(ctx, "_forward_cls", FusedRMSNormAffineFunction)._mixed
        out, rstd = _rms_forward(input.contiguous(), shape, weight.contiguous(), eps,
                                 weight.dtype if mixed else input.dtype, None)
        ctx.shape, ctx.memory_efficient = shape, memory_efficient
        ctx.save_for_backward(out if memory_efficient else input, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
        x_or_y, weight, rstd = ctx.saved_tensors
        x_hat = x_or_y.float() / weight.float() if ctx.memory_efficient else x_or_y.float() * rstd
        dx, dw = _rms_backward(grad_output, x_hat, rstd, ctx.shape, weight, ctx.needs_input_grad[1])
        in_dtype = ctx.saved_tensors[0].dtype
        return dx.to(in_dtype), None if dw is None else dw.to(weight.dtype), None, None, None


class FusedRMSNormAffineMixedDtypesFunction(FusedRMSNormAffineFunction):
    """The mixed variant: output in the weight's dtype."""

    _mixed = True


class FusedRMSNormFunction(torch.autograd.Function):
    """apex's ``FusedRMSNormFunction.apply(input, normalized_shape, eps, memory_efficient)`` (no affine)."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, normalized_shape: Shape, eps: float, memory_efficient: bool = False) -> Tensor:
        shape = _shape(normalized_shape)
        out, rstd = _rms_forward(input.contiguous(), shape, None, eps, input.dtype, None)
        ctx.shape, ctx.memory_efficient = shape, memory_efficient
        ctx.save_for_backward(out if memory_efficient else input, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
        x_or_y, rstd = ctx.saved_tensors
        x_hat = x_or_y.float() if ctx.memory_efficient else x_or_y.float() * rstd
        dx, _ = _rms_backward(grad_output, x_hat, rstd, ctx.shape, None, False)
        return dx.to(x_or_y.dtype), None, None, None


class FastLayerNormFN(FusedLayerNormAffineFunction):
    """apex.contrib's ``FastLayerNormFN.apply(x, gamma, beta, epsilon, memory_efficient)`` (megatron's persist LN)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gamma: Tensor, beta: Tensor, epsilon: float,  # type: ignore[override]
                memory_efficient: bool = False) -> Tensor:
        return FusedLayerNormAffineFunction.forward(ctx, x, gamma, beta, tuple(gamma.shape), epsilon,
                                                    memory_efficient)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
        dx, dw, db, *_ = FusedLayerNormAffineFunction.backward(ctx, dy)
        return dx, dw, db, None, None


# -- apex's functional API (autocast handling as apex: cast to the autocast dtype, then run in it) --

def _autocast_args(tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
    for device_type in ("cpu", "cuda"):
        try:
            enabled = torch.is_autocast_enabled(device_type)
        except (RuntimeError, TypeError):
            continue
        if enabled:
            dt = torch.get_autocast_dtype(device_type)
            return [t.to(dt) if t is not None and t.is_floating_point() else t for t in tensors]
    return list(tensors)


def fused_layer_norm_affine(input: Tensor, weight: Tensor, bias: Tensor, normalized_shape: Shape,
                            eps: float = 1e-6, memory_efficient: bool = False) -> Tensor:
    """apex's function: affine layer norm, output in the input's dtype."""
    input, weight, bias = _autocast_args((input, weight, bias))
    if not memory_efficient and input.dtype == weight.dtype == bias.dtype and input.dtype not in _HALF:
        return F.layer_norm(input, _shape(normalized_shape), weight, bias, eps)  # the same kernels, no Python backward
    with torch.autocast(input.device.type, enabled=False):
        return FusedLayerNormAffineFunction.apply(input, weight, bias, normalized_shape, eps, memory_efficient)


def fused_layer_norm(input: Tensor, normalized_shape: Shape, eps: float = 1e-6, memory_efficient: bool = False) -> Tensor:
    """apex's function: layer norm without affine parameters."""
    (input,) = _autocast_args((input,))
    with torch.autocast(input.device.type, enabled=False):
        return FusedLayerNormFunction.apply(input, normalized_shape, eps, memory_efficient)


def mixed_dtype_fused_layer_norm_affine(input: Tensor, weight: Tensor, bias: Tensor, normalized_shape: Shape,
                                        eps: float = 1e-6, memory_efficient: bool = False) -> Tensor:
    """apex's function: affine layer norm, output in the weight's dtype."""
    input, weight, bias = _autocast_args((input, weight, bias))
    with torch.autocast(input.device.type, enabled=False):
        return FusedLayerNormAffineMixedDtypesFunction.apply(input, weight, bias, normalized_shape, eps,
                                                             memory_efficient)


def fused_rms_norm_affine(input: Tensor, weight: Tensor, normalized_shape: Shape, eps: float = 1e-6,
                          memory_efficient: bool = False) -> Tensor:
    """apex's function: RMS norm with a weight, output in the input's dtype."""
    input, weight = _autocast_args((input, weight))
    with torch.autocast(input.device.type, enabled=False):
        if _rms_kernel() is not None:
            return rms_norm(input, normalized_shape, weight, eps)
        return FusedRMSNormAffineFunction.apply(input, weight, normalized_shape, eps, memory_efficient)


def fused_rms_norm(input: Tensor, normalized_shape: Shape, eps: float = 1e-6, memory_efficient: bool = False) -> Tensor:
    """apex's function: RMS norm without a weight."""
    (input,) = _autocast_args((input,))
    with torch.autocast(input.device.type, enabled=False):
        if _rms_kernel() is not None:
            return rms_norm(input, normalized_shape, None, eps)
        return FusedRMSNormFunction.apply(input, normalized_shape, eps, memory_efficient)


def mixed_dtype_fused_rms_norm_affine(input: Tensor, weight: Tensor, normalized_shape: Shape, eps: float = 1e-6,
                                      memory_efficient: bool = False) -> Tensor:
    """apex's function: RMS norm with a weight, output in the weight's dtype."""
    input, weight = _autocast_args((input, weight))
    with torch.autocast(input.device.type, enabled=False):
        if _rms_kernel() is not None:
            return rms_norm(input, normalized_shape, weight, eps, out_dtype=weight.dtype)
        return FusedRMSNormAffineMixedDtypesFunction.apply(input, weight, normalized_shape, eps, memory_efficient)
