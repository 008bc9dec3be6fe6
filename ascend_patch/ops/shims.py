"""Shim modules for CUDA-only packages: apex, amp_C, fused_layer_norm_cuda, flash_attn.

The patch manager serves a shim only while the real package is missing (its finder sits
at the end of ``sys.meta_path``), marks it as a shim (``find_spec(...).origin`` names
ascend_patch) and deletes it on ``remove()``. A name a shim lacks fails with an error
naming it and what to use instead.

:class:`ShimCatalog` builds the adapted objects once per apply (they read the target at call time), so
``apex.optimizers.FusedAdam is apex.optimizers.fused_adam.FusedAdam``. (The ``transformer_engine``
shim exists for megatron-core: :mod:`ascend_patch.adaptors.megatron.te`.)
"""

from __future__ import annotations

import functools
from typing import Any

from ..shim import SHIM_INIT, ShimModule

__all__ = ["SHIM_NAMES", "ShimCatalog", "named_class", "shim_module", "shim_patches"]

# every module name a shim is served under (parents before children)
SHIM_NAMES: tuple[str, ...] = (
    "apex", "apex.optimizers", "apex.optimizers.fused_adam", "apex.optimizers.fused_sgd",
    "apex.normalization", "apex.normalization.fused_layer_norm",
    "apex.multi_tensor_apply", "apex.multi_tensor_apply.multi_tensor_apply",
    "apex.contrib", "apex.contrib.layer_norm", "apex.contrib.layer_norm.layer_norm",
    "amp_C", "fused_layer_norm_cuda",
    "flash_attn", "flash_attn.flash_attn_interface", "flash_attn.layers", "flash_attn.layers.rotary",
)

_AMP = "use torch.amp (torch.autocast + torch.amp.GradScaler), which ascend_patch maps onto the target"
_APEX_HINTS = {
    "amp": f"apex.amp is deprecated upstream; {_AMP}",
    "fp16_utils": _AMP,
    "parallel": "use torch.nn.parallel.DistributedDataParallel and torch.nn.SyncBatchNorm",
    "transformer": "use megatron-core",
    "*": "the shim provides apex.optimizers (FusedAdam, FusedSGD), apex.normalization, "
         "apex.multi_tensor_apply and apex.contrib.layer_norm",
}
_OPTIM_HINTS = {
    "FusedLAMB": "use torch.optim.AdamW(fused=True) or write LAMB with torch._foreach ops",
    "FusedMixedPrecisionLamb": "use torch.optim.AdamW(fused=True)",
    "FusedNovoGrad": "use torch.optim.AdamW(fused=True)",
    "FusedAdagrad": "use torch.optim.Adagrad(fused=True)",
    "*": "the shim provides FusedAdam and FusedSGD",
}
_AMP_C_HINTS = {
    "multi_tensor_l2norm_mp": "use multi_tensor_l2norm (it accumulates in fp32)",
    "multi_tensor_l2norm_scale": "call multi_tensor_scale, then multi_tensor_l2norm",
    "multi_tensor_unscale_l2norm": "call multi_tensor_scale with 1/scale, then multi_tensor_l2norm",
    "*": "the shim provides multi_tensor_scale, multi_tensor_l2norm, multi_tensor_adam(_capturable(_master)), "
         "multi_tensor_sgd and multi_tensor_axpby",
}
_FLASH_HINTS = {
    "bert_padding": "unpad with attention_mask.flatten().nonzero() and call flash_attn_varlen_func",
    "ops": "the fused ops are not provided; use torch's (e.g. torch.nn.functional.layer_norm)",
    "modules": "build the model from torch.nn or megatron-core modules",
    "losses": "use torch.nn.functional.cross_entropy",
    "*": "the shim provides flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func, "
         "flash_attn_kvpacked_func, their varlen variants, flash_attn_with_kvcache and "
         "flash_attn.layers.rotary.apply_rotary_emb",
}
_INTERFACE_HINTS = {
    "_flash_attn_forward": "private kernels are not provided; call flash_attn_func",
    "_flash_attn_backward": "private kernels are not provided; autograd differentiates flash_attn_func",
    "_flash_attn_varlen_forward": "private kernels are not provided; call flash_attn_varlen_func",
    "*": _FLASH_HINTS["*"],
}
_ROTARY_HINTS = {
    "RotaryEmbedding": "compute cos/sin yourself and call apply_rotary_emb (provided)",
    "apply_rotary_emb_qkv_": "split qkv and call apply_rotary_emb on q and k",
    "apply_rotary_emb_kv_": "call apply_rotary_emb on k",
    "*": "the shim provides apply_rotary_emb, apply_rotary_emb_func, apply_rotary_emb_torch and rotate_half",
}
def named_class(base: type, name: str, module: str) -> type:
    return type(base)(name, (base,), {"__module__": module, "__qualname__": name})


def shim_module(name: str, doc: str, hints: dict[str, str], attrs: dict[str, Any],
            children: tuple[str, ...] = ()) -> ShimModule:
    mod = ShimModule(name, f"ascend_patch shim for {name}: {doc}", hints)
    for key, value in attrs.items():
        setattr(mod, key, value)
    mod.__all__ = sorted(attrs)
    if children:
        def init(module: ShimModule) -> None:
            import importlib

            for child in children:  # as the real package's __init__ does
                importlib.import_module(f"{name}.{child}")

        setattr(mod, SHIM_INIT, init)
    return mod


class ShimCatalog:
    """The adapted objects of every shim, built once per apply (ops read the target at call time)."""

    @functools.cached_property
    def apex_optimizers(self) -> dict[str, Any]:
        from . import optim

        return {"FusedAdam": named_class(optim.ApexFusedAdam, "FusedAdam", "apex.optimizers.fused_adam"),
                "FusedSGD": named_class(optim.ApexFusedSGD, "FusedSGD", "apex.optimizers.fused_sgd")}

    @functools.cached_property
    def apex_norm_modules(self) -> dict[str, Any]:
        from . import norm_apex

        mod = "apex.normalization.fused_layer_norm"
        return {name: named_class(getattr(norm_apex, name), name, mod)
                for name in ("FusedLayerNorm", "MixedFusedLayerNorm", "FusedRMSNorm", "MixedFusedRMSNorm")}

    @functools.cached_property
    def apex_norm_functional(self) -> dict[str, Any]:
        from . import norm

        return {name: getattr(norm, name) for name in (
            "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
            "FusedRMSNormAffineFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction",
            "fused_layer_norm_affine", "fused_layer_norm", "mixed_dtype_fused_layer_norm_affine",
            "fused_rms_norm_affine", "fused_rms_norm", "mixed_dtype_fused_rms_norm_affine")}

    @functools.cached_property
    def multi_tensor(self) -> dict[str, Any]:
        from . import multi_tensor as mt

        return {name: getattr(mt, name) for name in (
            "multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_axpby", "multi_tensor_adam",
            "multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master", "multi_tensor_sgd")}

    @functools.cached_property
    def flash(self) -> dict[str, Any]:
        from . import attention

        return {name: getattr(attention, name) for name in (
            "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
            "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache")}

    @functools.cached_property
    def rotary(self) -> dict[str, Any]:
        from . import rope

        return {"apply_rotary_emb": rope.apply_rotary_emb, "apply_rotary_emb_func": rope.apply_rotary_emb,
                "apply_rotary_emb_torch": rope.apply_rotary_emb_torch, "rotate_half": rope.rotate_half}

    # -- builders: name -> module ------------------------------------------------------------

    def build(self, name: str) -> ShimModule:
        """The shim module called ``name`` (one of :data:`SHIM_NAMES`)."""
        builder = getattr(self, "_" + name.replace(".", "_"), None)
        if builder is None:
            raise KeyError(f"no shim called {name!r}; known: {', '.join(SHIM_NAMES)}")
        return builder(name)

    def _apex(self, name: str) -> ShimModule:
        return shim_module(name, "apex's fused optimizers and norms on the target", _APEX_HINTS, {},
                       children=("optimizers", "normalization"))

    def _apex_optimizers(self, name: str) -> ShimModule:
        return shim_module(name, "FusedAdam, FusedSGD", _OPTIM_HINTS, dict(self.apex_optimizers))

    def _apex_optimizers_fused_adam(self, name: str) -> ShimModule:
        return shim_module(name, "FusedAdam", _OPTIM_HINTS, {"FusedAdam": self.apex_optimizers["FusedAdam"]})

    def _apex_optimizers_fused_sgd(self, name: str) -> ShimModule:
        return shim_module(name, "FusedSGD", _OPTIM_HINTS, {"FusedSGD": self.apex_optimizers["FusedSGD"]})

    def _apex_normalization(self, name: str) -> ShimModule:
        return shim_module(name, "fused layer/RMS norms", {"*": "the shim provides FusedLayerNorm, MixedFusedLayerNorm, "
                                                            "FusedRMSNorm and MixedFusedRMSNorm"},
                       dict(self.apex_norm_modules), children=("fused_layer_norm",))

    def _apex_normalization_fused_layer_norm(self, name: str) -> ShimModule:
        hints = {"manual_rms_norm": "use torch.nn.functional.rms_norm",
                 "*": "the shim provides the norm modules, their autograd functions and functional forms"}
        return shim_module(name, "fused layer/RMS norms", hints, {**self.apex_norm_modules, **self.apex_norm_functional})

    def _apex_multi_tensor_apply(self, name: str) -> ShimModule:
        from . import multi_tensor as mt

        return shim_module(name, "multi_tensor_applier", {"*": "the shim provides multi_tensor_applier"},
                       {"multi_tensor_applier": mt.multi_tensor_applier, "MultiTensorApply": mt.MultiTensorApply})

    def _apex_multi_tensor_apply_multi_tensor_apply(self, name: str) -> ShimModule:
        from . import multi_tensor as mt

        return shim_module(name, "MultiTensorApply", {"*": "the shim provides MultiTensorApply"},
                       {"MultiTensorApply": mt.MultiTensorApply})

    def _apex_contrib(self, name: str) -> ShimModule:
        return shim_module(name, "apex.contrib.layer_norm only", {
            "*": "only apex.contrib.layer_norm is provided; for the other contrib kernels use torch "
                 "(e.g. torch.nn.functional.cross_entropy for xentropy)"}, {})

    def _apex_contrib_layer_norm(self, name: str) -> ShimModule:
        from . import norm_apex

        return shim_module(name, "FastLayerNorm", {"*": "the shim provides FastLayerNorm"},
                       {"FastLayerNorm": norm_apex.FastLayerNorm})

    def _apex_contrib_layer_norm_layer_norm(self, name: str) -> ShimModule:
        from . import norm, norm_apex

        return shim_module(name, "FastLayerNorm, FastLayerNormFN", {"*": "the shim provides FastLayerNorm and "
                                                                    "FastLayerNormFN"},
                       {"FastLayerNorm": norm_apex.FastLayerNorm, "FastLayerNormFN": norm.FastLayerNormFN})

    def _amp_C(self, name: str) -> ShimModule:
        return shim_module(name, "multi-tensor ops with apex's overflow-flag semantics", _AMP_C_HINTS,
                       dict(self.multi_tensor))

    def _fused_layer_norm_cuda(self, name: str) -> ShimModule:
        from . import norm_apex

        return shim_module(name, "apex's layer/RMS norm extension functions", {
            "*": "the shim provides forward/backward(_affine), rms_forward/rms_backward(_affine) and the "
                 "*_mixed_dtypes forwards"}, norm_apex.cuda_module_functions())

    def _flash_attn(self, name: str) -> ShimModule:
        mod = shim_module(name, "flash-attn 2's API on the target", _FLASH_HINTS, dict(self.flash),
                      children=("flash_attn_interface",))
        mod.__version__ = "2.8.3"  # the flash-attn 2 API level the adaptor implements (not an install)
        return mod

    def _flash_attn_flash_attn_interface(self, name: str) -> ShimModule:
        return shim_module(name, "flash-attn 2's functions", _INTERFACE_HINTS, dict(self.flash))

    def _flash_attn_layers(self, name: str) -> ShimModule:
        return shim_module(name, "flash_attn.layers.rotary only", {"*": "only flash_attn.layers.rotary is provided"}, {})

    def _flash_attn_layers_rotary(self, name: str) -> ShimModule:
        return shim_module(name, "apply_rotary_emb", _ROTARY_HINTS, dict(self.rotary))


def shim_patches(backend: Any) -> list[Any]:
    """MODULE patches serving every shim in :data:`SHIM_NAMES` (``backend`` decides the reported action)."""
    from ..patch import Action, ModuleShim

    catalog = ShimCatalog()
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED
    return [ModuleShim(target=name, make=catalog.build, action=action,
                       reason=f"{name.split('.')[0]} is CUDA-only; serve ascend_patch's adapted {name} while it is "
                              "not installed")
            for name in SHIM_NAMES]
