"""SwiGLU, bias-SwiGLU and bias-GeLU, megatron-core's fused activations, on the target without ``torch.compile``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ..backend import current_target
from ..unsupported import UnsupportedOption

__all__ = [
    "bias_gelu",
    "bias_swiglu",
    "clamped_swiglu",
    "swiglu",
]


def _kernel() -> Any:
    return current_target().kernels.get("npu_swiglu")


class _BiasSwiGLUFn(torch.autograd.Function):
    """megatron's exact forward and an analytic backward, eager: megatron builds these with ``jit_fuser``
    (``torch.compile``), which on a host means a C++ compiler and seconds of compilation per process.
    ``fp8_input_store`` keeps the input for backward as float8_e4m3fn; ``cpu_offload_input`` tags the
    saved tensors ``activation_offloading``."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, bias: Tensor | None, fp8_input_store: bool,
                cpu_offload_input: bool) -> Tensor:
        y = input if bias is None else input + bias
        if fp8_input_store:
            # megatron keeps the input in fp8 and the bias apart; backward adds them again
            saved: tuple[Tensor | None, ...] = (input.to(torch.float8_e4m3fn), bias)
        else:
            saved = (y, None)  # y = input + bias: the same memory as the input, one add less in backward
        if cpu_offload_input:
            saved[0].activation_offloading = True
            if bias is not None:
                bias.activation_offloading = True
        ctx.save_for_backward(*saved)
        ctx.in_dtype, ctx.fp8, ctx.has_bias = input.dtype, fp8_input_store, bias is not None
        a, b = y.chunk(2, -1)
        return F.silu(a).mul_(b)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        saved, bias = ctx.saved_tensors
        if ctx.fp8:
            x = saved.to(ctx.in_dtype)
            y = x if bias is None else x + bias
        else:
            y = saved
        a, b = y.chunk(2, -1)
        grad = torch.empty_like(y)
        da, db = grad.chunk(2, -1)
        # d/da silu(a)*b = g*b * silu'(a) (one silu_backward kernel), d/db = g*silu(a): each half computed
        # in place in its slice of the gradient: no cat, and no half-size temporaries (on a host, a fresh
        # large buffer costs page faults on every step)
        torch.mul(g, b, out=da)
        torch.ops.aten.silu_backward.grad_input(da, a, grad_input=da)
        torch.ops.aten.silu.out(a, out=db)
        db.mul_(g)
        return grad, (grad if ctx.has_bias else None), None, None


def swiglu(x: Tensor, dim: int = -1) -> Tensor:
    """``silu(first half) * second half`` of ``x`` along ``dim``, differentiable."""
    kernel = _kernel()
    if kernel is not None:
        return kernel(x, dim=dim)
    if dim not in (-1, x.dim() - 1):
        a, b = x.chunk(2, dim)
        return F.silu(a) * b
    return _BiasSwiGLUFn.apply(x, None, False, False)


def bias_swiglu(input: Tensor, bias: Tensor | None, fp8_input_store: bool = False,
                cpu_offload_input: bool = False, clamp_value: float | None = None) -> Tensor:
    """``swiglu(input + bias)`` over the last dim with megatron's memory options.

    ``npu_swiglu`` (torch_npu gives it a backward) where the current target has it, unless a memory option
    asks for :class:`_BiasSwiGLUFn`. ``clamp_value`` (megatron-core main): the gate half clamped from above
    and the linear half to ``[-clamp_value, clamp_value]`` before the product, computed in fp32 as megatron's
    ``clamped_swiglu``.
    """
    if clamp_value is not None:
        if fp8_input_store:
            raise UnsupportedOption("bias_swiglu(clamp_value=..., fp8_input_store=True): the clamped SwiGLU keeps "
                                    "its input at full precision here; drop --activation-func-fp8-input-store")
        return clamped_swiglu(input if bias is None else input + bias, clamp_value)
    kernel = _kernel()
    if kernel is not None and not fp8_input_store and not cpu_offload_input:
        return kernel(input if bias is None else input + bias, dim=-1)
    return _BiasSwiGLUFn.apply(input, bias, fp8_input_store, cpu_offload_input)


def clamped_swiglu(y: Tensor, clamp_value: float) -> Tensor:
    """``silu(min(a, c)) * clamp(b, -c, c)`` for the halves ``a, b`` of ``y``'s last dim, in fp32, differentiable."""
    a, b = y.float().chunk(2, -1)
    return (F.silu(a.clamp(max=clamp_value)) * b.clamp(min=-clamp_value, max=clamp_value)).to(y.dtype)


def bias_gelu(input: Tensor, bias: Tensor | None) -> Tensor:
    """Tanh-approximated GeLU of ``input + bias`` (megatron's ``bias_gelu``), differentiable.

    torch's ``gelu(approximate="tanh")``: the formula megatron's ``bias_gelu`` hand-writes, with its exact
    derivative, on both targets.
    """
    return F.gelu(input if bias is None else input + bias, approximate="tanh")
