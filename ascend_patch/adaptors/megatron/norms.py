"""megatron-core's norms on the target: RMSNorm on ``npu_rms_norm``, and the torch norm under sequence parallelism.

Without apex, megatron-core's specs build ``WrappedTorchNorm`` (``torch.nn.LayerNorm`` /
``RMSNorm``), which refuses ``sequence_parallel`` and ``persist_layer_norm`` because on a
GPU those are apex's ``FusedLayerNorm`` features. On the targets they are not kernel
features at all:

* sequence parallel: the norm runs on the local sequence shard; its weight gradients are
  partial sums over that shard and must be all-reduced over the TP group. megatron-core
  does that in ``finalize_model_grads`` for every parameter tagged ``sequence_parallel``,
  so the norm is built as usual and its parameters are tagged (as apex's FusedLayerNorm
  tags its own).
* persist_layer_norm: picks apex's persistent-kernel LayerNorm for some hidden sizes (a
  speed choice with the same result); the target's norm is used.
* memory_efficient_layer_norm: apex saves the output instead of the input for backward
  (same result); accepted for the same reason.

RMSNorm is built on the target's kernel: when the current target's kernel table has
``npu_rms_norm`` (the npu target), the ops adaptor ``ascend_patch.ops.norm_apex.FusedRMSNorm``
(fp32 statistics, output in the input dtype, torch_npu's backward); otherwise
``torch.nn.RMSNorm``, which on the cpu target is as fast as the adaptor or faster (bf16,
4x1024x2048, forward + backward: 214 ms against 231 ms). Both keep the state-dict key
``weight``, so checkpoints move between targets.

``layernorm_zero_centered_gamma`` changes the parameterisation and stays refused, naming
what to do.

With the apex shim importable, megatron-core's local specs pick its ``FusedLayerNorm``
for LayerNorm, and that class refuses RMSNorm (on a GPU, RMSNorm models use TE's norm).
``FusedLayerNorm`` therefore builds the RMSNorm above for RMSNorm configs, so making apex
importable never breaks a model that worked without it.
"""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedSetting
from ...patch import Patch, Replace
from .releases import needed_on

__all__ = ["build_norm", "fused_layer_norm_new", "norm_patches", "rms_norm_module"]


def rms_norm_module(hidden_size: int, eps: float) -> Any:
    """RMSNorm on the current target: the ops adaptor on ``npu_rms_norm`` when its kernel table has it, else torch's."""
    import torch

    from ...backend import current_target

    if current_target().kernels.get("npu_rms_norm") is not None:
        from ...ops.norm_apex import FusedRMSNorm

        return FusedRMSNorm(hidden_size, eps=eps)
    return torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)


def build_norm(cls: Any, config: Any, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
               zero_centered_gamma: bool = False, normalization: str = "LayerNorm") -> Any:
    """``WrappedTorchNorm(config, hidden_size, eps, ...)`` on the current target."""
    import torch

    if getattr(config, "layernorm_zero_centered_gamma", False) or zero_centered_gamma:
        raise UnsupportedSetting(
            "layernorm_zero_centered_gamma is not supported by megatron-core's torch norm on this target "
            "(it stores gamma - 1); set layernorm_zero_centered_gamma=False (--apply-layernorm-1p off)")
    kind = config.normalization
    if kind == "LayerNorm":
        norm = torch.nn.LayerNorm(normalized_shape=hidden_size, eps=eps)
    elif kind == "RMSNorm":
        norm = rms_norm_module(hidden_size, eps)
    elif kind == "L2Norm":
        from megatron.core.transformer.torch_norm import L2Norm

        norm = L2Norm(hidden_size=hidden_size, eps=eps)
    else:
        raise UnsupportedSetting(f"normalization={kind!r} is not supported; use LayerNorm, RMSNorm or L2Norm")
    if config.sequence_parallel:
        for param in norm.parameters():
            param.sequence_parallel = True  # finalize_model_grads all-reduces these over TP
    return norm


def fused_layer_norm_new(cls: Any, config: Any, hidden_size: int, *args: Any, **kwargs: Any) -> Any:
    """``FusedLayerNorm(...)``: LayerNorm as megatron-core builds it; other kinds as :func:`build_norm`."""
    if getattr(config, "normalization", "LayerNorm") != "LayerNorm":
        eps = args[0] if args else kwargs.get("eps", 1e-5)
        return build_norm(cls, config, hidden_size, eps)  # not an instance: __init__ is skipped
    return object.__new__(cls)


def norm_patches(backend: Any = None) -> list[Patch]:
    """The norm patches (``backend`` decides what the reasons say; the norms read the target when built)."""
    # each reason says what the patch does on this target (docs/coverage.md shows the cpu target's)
    if getattr(backend, "name", "cpu") == "npu":
        fused_why = ("RMSNorm configs get npu_rms_norm (ascend_patch.ops.norm_apex.FusedRMSNorm; torch's norm if "
                     "the kernel table lacks it): megatron's FusedLayerNorm refuses RMSNorm, and the apex shim makes "
                     "the local specs choose it")
        wrapped_why = ("RMSNorm on npu_rms_norm (ascend_patch.ops.norm_apex.FusedRMSNorm); the torch norm under "
                       "sequence parallelism (params tagged for the TP all-reduce) and with persist_layer_norm / "
                       "memory_efficient_layer_norm (apex kernel choices)")
    else:
        fused_why = ("RMSNorm configs get the torch norm megatron-core builds without apex (its FusedLayerNorm "
                     "refuses RMSNorm, and the apex shim makes the local specs choose it)")
        wrapped_why = ("torch norm under sequence parallelism (params tagged for the TP all-reduce) and with "
                       "persist_layer_norm / memory_efficient_layer_norm (apex kernel choices)")
    return [Replace(
        "megatron.core.fusions.fused_layer_norm:FusedLayerNorm.__new__", fused_why,
        replacement=staticmethod(fused_layer_norm_new), **needed_on(), 
        api="megatron.core.fusions.fused_layer_norm.FusedLayerNorm", count_calls=False), Replace(
        "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__", wrapped_why,
        replacement=staticmethod(build_norm), **needed_on(), 
        api="megatron.core.transformer.torch_norm.WrappedTorchNorm", count_calls=False)]
