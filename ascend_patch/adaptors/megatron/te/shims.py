"""The ``transformer_engine`` shim modules: the TE layer served while the real package is missing."""

from __future__ import annotations

import functools
import sys
from typing import Any

from ....ops.shims import ShimCatalog, named_class, shim_module
from ....shim import ShimModule
from . import SURFACE, surface

__all__ = ["TECatalog", "te_hidden_from", "te_shim_patches"]

_MEGATRON_TE = "megatron.core.extensions.transformer_engine"

_TE_HINTS = {
    "ops": "TE's operation-based API is not provided; drop --use-te-activation-func and "
           "--use-transformer-engine-op-fuser",
    "module": "TE's userbuffers (--tp-comm-overlap) are not available on this target; drop --tp-comm-overlap",
    "attention": "TE's fused RoPE / packed-QKV helpers are not provided; megatron-core falls back to its own",
    "*": "ascend_patch's transformer_engine layer provides transformer_engine.pytorch.Linear, LayerNormLinear, "
         "GroupedLinear, LayerNorm, RMSNorm, DotProductAttention, fp8_autocast (FP8 off), .optimizers, "
         ".distributed's RNG tracker, .permutation (--moe-permute-fusion), .router (--moe-router-fusion), "
         ".cross_entropy "
         "(--cross-entropy-fusion-impl te) and transformer_engine.common.recipe; see docs/megatron.md for the "
         "coverage table",
}
_TE_OPT_HINTS = {
    "multi_tensor_adam_fp8": "fp8 optimizer states are not supported; use multi_tensor_adam",
    "multi_tensor_adam_capturable": "CUDA-graph capture is not available; use multi_tensor_adam",
    "multi_tensor_adam_capturable_master": "CUDA-graph capture is not available; use multi_tensor_adam",
    "multi_tensor_unscale_l2norm": "call multi_tensor_scale with 1/scale, then multi_tensor_l2norm",
    "multi_tensor_scale_tensor": "use multi_tensor_scale with a Python float",
    "*": "the shim provides FusedAdam, FusedSGD, multi_tensor_applier, multi_tensor_scale, multi_tensor_l2norm, "
         "multi_tensor_adam and multi_tensor_sgd",
}


def te_hidden_from() -> tuple[str, ...]:
    """``("megatron",)`` when megatron-core was imported *without* Transformer Engine, else ``()``.

    ``import megatron.core`` decides once, in ``megatron.core.extensions.transformer_engine``,
    whether TE exists (``HAVE_TE``); modules it imports later decide again. Shown the TE layer
    after that first decision said "no", megatron would mix both answers (``TENorm`` picked
    by ``transformer_block``, refused by the extension: "Transformer Engine is not installed").
    So a process that imported megatron-core before ascend_patch keeps megatron's local path
    consistently; user code still gets the layer.
    """
    extension = sys.modules.get(_MEGATRON_TE)
    if extension is not None and not getattr(extension, "HAVE_TE", False):
        return ("megatron",)
    return ()


class TECatalog:
    """The TE layer's objects, built once per apply (one class per name)."""

    def __init__(self) -> None:
        self.ops = ShimCatalog()  # TE's optimizers share apex's multi-tensor ops
        self._classes: dict[str, type] = {}

    @functools.cached_property
    def te_optimizers(self) -> dict[str, Any]:
        from ....ops import multi_tensor as mt
        from ....ops import optim

        mod = "transformer_engine.pytorch.optimizers"
        return {"FusedAdam": named_class(optim.TEFusedAdam, "FusedAdam", f"{mod}.fused_adam"),
                "FusedSGD": named_class(optim.TEFusedSGD, "FusedSGD", f"{mod}.fused_sgd"),
                "MultiTensorApply": mt.TEMultiTensorApply, "multi_tensor_applier": mt.te_multi_tensor_applier,
                "multi_tensor_scale": mt.multi_tensor_scale, "multi_tensor_l2norm": mt.multi_tensor_l2norm,
                "multi_tensor_adam": self.ops.multi_tensor["multi_tensor_adam"],
                "multi_tensor_sgd": self.ops.multi_tensor["multi_tensor_sgd"]}

    def te_bound(self, cls: type, name: str, module: str) -> type:
        """``cls`` as the shim's class ``name`` in ``module`` (one class per name per apply)."""
        named = self._classes.get(name)
        if named is None:
            named = self._classes[name] = named_class(cls, name, module)
        return named

    def build(self, name: str) -> ShimModule:
        """The shim module called ``name`` (one of :data:`SURFACE`)."""
        if name not in SURFACE:
            raise KeyError(f"no transformer_engine shim called {name!r}; known: {', '.join(SURFACE)}")
        doc, _build, children = SURFACE[name]
        attrs = surface(self, name)
        hints = {"transformer_engine.pytorch.optimizers": _TE_OPT_HINTS,
                 "transformer_engine.pytorch.ops": {"*": _TE_HINTS["ops"]}}.get(name, _TE_HINTS)
        mod = shim_module(name, doc, hints, {k: v for k, v in attrs.items() if not k.startswith("__")},
                          children=children)
        for key, value in attrs.items():
            if key.startswith("__"):
                setattr(mod, key, value)  # e.g. __version__: on the module, not in __all__
        return mod


def te_shim_patches(backend: Any) -> list[Any]:
    """MODULE patches serving every module of :data:`SURFACE` (``backend`` decides the reported action)."""
    from ....patch import Action, ModuleShim

    catalog = TECatalog()
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED
    hidden = te_hidden_from()
    reason = ("transformer_engine is CUDA-only; serve ascend_patch's adapted {} while it is not installed (not to "
              "megatron-core when it was imported before ascend_patch without it: it keeps its local path)")
    return [ModuleShim(target=name, make=catalog.build, action=action, hidden_from=hidden,
                       reason=reason.format(name))
            for name in SURFACE]
