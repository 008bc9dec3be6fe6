"""megatron-core's torch norm (``WrappedTorchNorm``) under sequence parallelism and persist_layer_norm.

Without apex, megatron-core's specs build ``WrappedTorchNorm``, which refuses
``sequence_parallel`` and ``persist_layer_norm`` because on a GPU those are apex's
``FusedLayerNorm`` features. On the targets they are not kernel features at all:

* sequence parallel: the norm runs on the local sequence shard; its weight gradients are
  partial sums over that shard and must be all-reduced over the TP group. megatron-core
  does that in ``finalize_model_grads`` for every parameter tagged ``sequence_parallel``,
  so the norm is built as usual and its parameters are tagged (as apex's FusedLayerNorm
  tags its own).
* persist_layer_norm: picks apex's persistent-kernel LayerNorm for some hidden sizes (a
  speed choice with the same result); the target's norm is used.
* memory_efficient_layer_norm: apex saves the output instead of the input for backward
  (same result); accepted for the same reason.

``layernorm_zero_centered_gamma`` changes the parameterisation and stays refused, naming
what to do.

With the apex shim importable, megatron-core's local specs pick its ``FusedLayerNorm``
for every norm, and that class refuses RMSNorm (on a GPU, RMSNorm models use TE's
norm). Without apex they would have built the torch norm; ``FusedLayerNorm`` therefore
builds exactly that for RMSNorm configs, so making apex importable never breaks a
model that worked without it.
"""

from __future__ import annotations

from typing import Any

from ...patch import Patch, PatchKind
from . import PACKAGE, VERSIONS

__all__ = ["build_norm", "fused_layer_norm_new", "norm_patches"]


def build_norm(cls: Any, config: Any, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
               zero_centered_gamma: bool = False, normalization: str = "LayerNorm") -> Any:
    """``WrappedTorchNorm(config, hidden_size, eps, ...)`` on the target."""
    import torch

    if getattr(config, "layernorm_zero_centered_gamma", False) or zero_centered_gamma:
        raise ValueError(
            "layernorm_zero_centered_gamma is not supported by megatron-core's torch norm on this target "
            "(it stores gamma - 1); set layernorm_zero_centered_gamma=False (--apply-layernorm-1p off)")
    kind = config.normalization
    if kind == "LayerNorm":
        norm = torch.nn.LayerNorm(normalized_shape=hidden_size, eps=eps)
    elif kind == "RMSNorm":
        norm = torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)
    elif kind == "L2Norm":
        from megatron.core.transformer.torch_norm import L2Norm

        norm = L2Norm(hidden_size=hidden_size, eps=eps)
    else:
        raise ValueError(f"normalization={kind!r} is not supported; use LayerNorm, RMSNorm or L2Norm")
    if config.sequence_parallel:
        for param in norm.parameters():
            param.sequence_parallel = True  # finalize_model_grads all-reduces these over TP
    return norm


def fused_layer_norm_new(cls: Any, config: Any, hidden_size: int, *args: Any, **kwargs: Any) -> Any:
    """``FusedLayerNorm(...)``: LayerNorm as megatron-core builds it; other kinds as the torch norm."""
    if getattr(config, "normalization", "LayerNorm") != "LayerNorm":
        eps = args[0] if args else kwargs.get("eps", 1e-5)
        return build_norm(cls, config, hidden_size, eps)  # not an instance: __init__ is skipped
    return object.__new__(cls)


def norm_patches() -> list[Patch]:
    return [Patch(
        "megatron.core.fusions.fused_layer_norm:FusedLayerNorm.__new__", PatchKind.REPLACE,
        "RMSNorm configs get the torch norm megatron-core builds without apex (its FusedLayerNorm "
        "refuses RMSNorm, and the apex shim makes the local specs choose it)",
        replacement=staticmethod(fused_layer_norm_new), package=PACKAGE, versions=VERSIONS,
        api="megatron.core.fusions.fused_layer_norm.FusedLayerNorm", count_calls=False), Patch(
        "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__", PatchKind.REPLACE,
        "torch norm under sequence parallelism (params tagged for the TP all-reduce) and with "
        "persist_layer_norm / memory_efficient_layer_norm (apex kernel choices)",
        replacement=staticmethod(build_norm), package=PACKAGE, versions=VERSIONS,
        api="megatron.core.transformer.torch_norm.WrappedTorchNorm", count_calls=False)]
