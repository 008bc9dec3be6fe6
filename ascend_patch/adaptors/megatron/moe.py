"""Mixture of Experts in megatron-core 0.16 on the targets: the patches, declared in one place.

What stock megatron-core's MoE needs beyond the device and comm adaptors (the token
dispatchers' ``all_to_all_single`` / all-gather / reduce-scatter, their device-to-host
copies on a side stream and the aux-loss bookkeeping run through those unchanged):

* ``moe_utils.te_general_gemm``: the router's gating linear tests ``te_general_gemm is not
  None``, but the name is only defined when ``transformer_engine`` imports, so megatron-core
  imported without one (before ``apply()``, which serves the transformer_engine layer) dies
  with a NameError in every MoE forward. Added as None where missing (the router then runs its
  own torch.mm path); where megatron found a transformer_engine it is left alone.
* ``grouped_gemm``, the CUDA package megatron's legacy ``GroupedMLP`` (``--moe-grouped-gemm``
  with ``--transformer-impl local``) takes ``ops.gmm`` from: a shim module served while the
  package is missing, its ``gmm`` being :func:`ascend_patch.ops.grouped_gemm.grouped_matmul`
  (``npu_grouped_matmul`` on npu). If megatron-core was imported before the shim existed,
  ``grouped_gemm_util`` recorded the package as missing: its two module attributes are set.
* ``GroupedMLP.forward`` asserts ``config.bf16`` because the CUDA kernel is bf16-only; the
  targets' grouped GEMM takes fp32 and fp16 too, so the forward runs with that one check
  answered for the target (everything else is megatron's forward, unchanged).
* ``experts.jit_fuser``: ``GroupedMLP.__init__`` decorates its activation functions with the
  ``jit_fuser`` its module imported. With megatron-core imported before ``apply()`` that copy is
  still ``torch.compile`` (the :mod:`.jit` patch does not re-bind copies of torch's own function),
  so every GroupedMLP built afterwards would compile them with Inductor; the module's copy is made
  eager like ``megatron.core.jit.jit_fuser``.
"""

from __future__ import annotations

from typing import Any

from ...patch import Action, Add, ModuleShim, Patch, Replace, Wrap
from ...shim import ShimBuilder, ShimSpec, ShimTable, is_shim
from .releases import needed_on
from .jit import eager

__all__ = ["GROUPED_GEMM", "gmm", "moe_patches"]

_UTIL = "megatron.core.transformer.moe.grouped_gemm_util"
_LEGACY = needed_on("legacy_grouped_mlp")  # GroupedMLP on the grouped_gemm package


def gmm(a: Any, b: Any, batch_sizes: Any, trans_b: bool = False) -> Any:
    """grouped_gemm's ``ops.gmm``: rows of ``a`` grouped by ``batch_sizes``, group g times ``b[g]`` (on the target)."""
    from ...ops.grouped_gemm import grouped_matmul

    return grouped_matmul(a, b, batch_sizes, trans_b=trans_b)


_GG_HINTS = {"*": "the shim provides grouped_gemm.ops.gmm(a, b, batch_sizes, trans_b=False) only; "
                  "permute/unpermute/sinkhorn are megatron-core's own (moe_utils) on this target"}

GROUPED_GEMM: ShimTable = {
    # __version__: the API level megatron-core asks for (not an install)
    "grouped_gemm": ShimSpec("ops.gmm on the target's grouped matmul", children=("ops",), version="1.1.4",
                             hints=_GG_HINTS),
    "grouped_gemm.ops": ShimSpec("gmm on the target", {"gmm": "ascend_patch.adaptors.megatron.moe:gmm"},
                                 hints=_GG_HINTS),
}


class _DtypesOfTheTarget:
    """``GroupedMLP``'s config as its forward reads it, with ``bf16`` answered for the target's kernel."""

    __slots__ = ("_config",)

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        if name == "bf16":
            return True  # the only dtype check in the forward: the CUDA kernel's limit, not the target's
        return getattr(self._config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)


def _grouped_mlp_forward(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    config = instance.config
    if config.bf16 or isinstance(config, _DtypesOfTheTarget):
        return wrapped(*args, **kwargs)
    instance.config = _DtypesOfTheTarget(config)
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.config = config


def _ours(found: Any) -> bool:
    # missing, or a shim (of this apply or an earlier one): this apply's shim goes there; a real
    # grouped_gemm package is left alone
    return found is None or is_shim(found)


def moe_patches(backend: Any) -> list[Patch]:
    """The MoE patches for ``backend``: the grouped_gemm shim and megatron-core's MoE entry points."""
    shims = ShimBuilder(GROUPED_GEMM)  # one per apply: the package an import finds is the one handed to megatron
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED
    missing = "grouped_gemm is CUDA-only; serve ascend_patch's grouped GEMM while it is not installed"
    patches = [ModuleShim(name, missing, make=shims, action=action, api=name, **_LEGACY)
               for name in GROUPED_GEMM]
    patches += [
        Replace(f"{_UTIL}:grouped_gemm",
                "--moe-grouped-gemm: megatron-core imported before the grouped_gemm shim existed recorded the "
              "package as missing", make=lambda found: shims.module("grouped_gemm") if _ours(found) else found,
              action=action, count_calls=False, rebind=False, **_LEGACY),
        Replace(f"{_UTIL}:ops",
                "--moe-grouped-gemm: GroupedMLP calls gg.ops.gmm (None when the package was found missing)",
              make=lambda found: shims.module("grouped_gemm.ops") if _ours(found) else found,
              action=action, count_calls=False, rebind=False, **_LEGACY),
        Add("megatron.core.transformer.moe.moe_utils:te_general_gemm",
            "MoE router gating tests te_general_gemm, which is defined only when transformer_engine imports "
              "(NameError where megatron-core was imported without it); None selects the router's own torch.mm path",
              make=lambda _: None, action=Action.EMULATED, count_calls=False),
        Replace("megatron.core.transformer.moe.experts:jit_fuser",
                "GroupedMLP decorates its activations with jit_fuser when built: eager as megatron.core.jit's "
              "(this module's copy stays torch.compile when megatron-core was imported first)",
              replacement=eager, action=Action.EMULATED, count_calls=False, rebind=False, **_LEGACY),
        Wrap("megatron.core.transformer.moe.experts:GroupedMLP.forward",
             "GroupedMLP asserts bf16 (the CUDA grouped_gemm kernel's limit); the target's grouped GEMM also "
              "runs fp32 and fp16", wrapper=_grouped_mlp_forward, action=action, count_calls=False, **_LEGACY),
    ]
    return patches
