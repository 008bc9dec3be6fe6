"""apex's ``fused_layer_norm_cuda`` extension functions (flat fp32 ``mean`` / ``invvar``) on :mod:`.norm`'s ops."""

from __future__ import annotations

from torch import Tensor

from .norm import Shape, _ln_backward, _ln_forward, _rms_backward, _rms_forward, _rms_kernel, _shape, _stats_view

__all__ = [
    "backward",
    "backward_affine",
    "forward",
    "forward_affine",
    "forward_affine_mixed_dtypes",
    "rms_backward",
    "rms_backward_affine",
    "rms_forward",
    "rms_forward_affine",
    "rms_forward_affine_mixed_dtypes",
]


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1)


def forward_affine(input: Tensor, normalized_shape: Shape, gamma: Tensor, beta: Tensor,
                   epsilon: float) -> list[Tensor]:
    """Affine layer norm: ``[out, mean, invvar]``, statistics flat fp32, output in the input dtype."""
    out, mean, rstd = _ln_forward(input, _shape(normalized_shape), gamma, beta, epsilon, input.dtype)
    return [out, _flat(mean), _flat(rstd)]


def forward_affine_mixed_dtypes(input: Tensor, normalized_shape: Shape, gamma: Tensor, beta: Tensor,
                                epsilon: float) -> list[Tensor]:
    """As :func:`forward_affine`, output in gamma's dtype."""
    out, mean, rstd = _ln_forward(input, _shape(normalized_shape), gamma, beta, epsilon, gamma.dtype)
    return [out, _flat(mean), _flat(rstd)]


def forward(input: Tensor, normalized_shape: Shape, epsilon: float) -> list[Tensor]:
    """Layer norm without affine parameters: ``[out, mean, invvar]``."""
    out, mean, rstd = _ln_forward(input, _shape(normalized_shape), None, None, epsilon, input.dtype)
    return [out, _flat(mean), _flat(rstd)]


def backward_affine(dout: Tensor, mean: Tensor | None, invvar: Tensor, input_or_output: Tensor,
                    normalized_shape: Shape, gamma: Tensor, beta: Tensor, epsilon: float,
                    memory_efficient: bool = False) -> list[Tensor]:
    """``[dx, dgamma, dbeta]``; ``memory_efficient``: ``input_or_output`` is the output and ``mean`` unused."""
    dx, dw, db = _ln_backward(dout, input_or_output, mean, invvar, _shape(normalized_shape), gamma, beta,
                              memory_efficient, (True, True, True))
    return [dx, dw, db]


def backward(dout: Tensor, mean: Tensor | None, invvar: Tensor, input_or_output: Tensor,
             normalized_shape: Shape, epsilon: float, memory_efficient: bool = False) -> Tensor:
    """``dx`` of :func:`forward` (the output instead of the input when ``memory_efficient``)."""
    return _ln_backward(dout, input_or_output, mean, invvar, _shape(normalized_shape), None, None,
                        memory_efficient, (True, False, False))[0]


def rms_forward_affine(input: Tensor, normalized_shape: Shape, gamma: Tensor, epsilon: float) -> list[Tensor]:
    """RMS norm with gamma: ``[out, invvar]`` (``npu_rms_norm`` where the current target has it)."""
    out, rstd = _rms_forward(input, _shape(normalized_shape), gamma, epsilon, input.dtype, _rms_kernel())
    return [out, _flat(rstd)]


def rms_forward_affine_mixed_dtypes(input: Tensor, normalized_shape: Shape, gamma: Tensor,
                                    epsilon: float) -> list[Tensor]:
    """As :func:`rms_forward_affine`, output in gamma's dtype."""
    out, rstd = _rms_forward(input, _shape(normalized_shape), gamma, epsilon, gamma.dtype, _rms_kernel())
    return [out, _flat(rstd)]


def rms_forward(input: Tensor, normalized_shape: Shape, epsilon: float) -> list[Tensor]:
    """RMS norm without gamma: ``[out, invvar]``."""
    out, rstd = _rms_forward(input, _shape(normalized_shape), None, epsilon, input.dtype, _rms_kernel())
    return [out, _flat(rstd)]


def rms_backward_affine(dout: Tensor, invvar: Tensor, input_or_output: Tensor, normalized_shape: Shape,
                        gamma: Tensor, epsilon: float, memory_efficient: bool = False) -> list[Tensor]:
    """``[dx, dgamma]`` (the output instead of the input when ``memory_efficient``)."""
    shape = _shape(normalized_shape)
    rstd = _stats_view(input_or_output, shape, invvar.reshape(-1)).float()
    x = input_or_output.float()
    x_hat = x / gamma.float() if memory_efficient else x * rstd
    dx, dw = _rms_backward(dout, x_hat, rstd, shape, gamma, True)
    return [dx.to(input_or_output.dtype), dw.to(gamma.dtype)]


def rms_backward(dout: Tensor, invvar: Tensor, input_or_output: Tensor, normalized_shape: Shape,
                 epsilon: float, memory_efficient: bool = False) -> Tensor:
    """``dx`` of :func:`rms_forward`."""
    shape = _shape(normalized_shape)
    rstd = _stats_view(input_or_output, shape, invvar.reshape(-1)).float()
    x = input_or_output.float()
    dx, _ = _rms_backward(dout, x if memory_efficient else x * rstd, rstd, shape, None, False)
    return dx.to(input_or_output.dtype)
