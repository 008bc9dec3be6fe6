"""The apex, amp_C, fused_layer_norm_cuda and flash_attn shims, declared as tables (served while each is missing)."""

from __future__ import annotations

from typing import Any

from ..shim import Renamed, ShimBuilder, ShimSpec, ShimTable

__all__ = ["AMP_C", "APEX", "FLASH_ATTN", "FUSED_LAYER_NORM_CUDA", "TABLES", "shim_patches"]

_OPS = "ascend_patch.ops"
_AMP = "use torch.amp (torch.autocast + torch.amp.GradScaler), which ascend_patch maps onto the target"
_OPTIM_HINTS = {
    "FusedLAMB": "use torch.optim.AdamW(fused=True) or write LAMB with torch._foreach ops",
    "FusedMixedPrecisionLamb": "use torch.optim.AdamW(fused=True)",
    "FusedNovoGrad": "use torch.optim.AdamW(fused=True)",
    "FusedAdagrad": "use torch.optim.Adagrad(fused=True)",
    "*": "the shim provides FusedAdam and FusedSGD",
}
# apex's classes keep their stock names and modules (a subclass of ours per apply)
_ADAM = Renamed(f"{_OPS}.optim:ApexFusedAdam", "apex.optimizers.fused_adam")
_SGD = Renamed(f"{_OPS}.optim:ApexFusedSGD", "apex.optimizers.fused_sgd")
_NORM_MODULES = {name: Renamed(f"{_OPS}.norm_apex:{name}", "apex.normalization.fused_layer_norm")
                 for name in ("FusedLayerNorm", "MixedFusedLayerNorm", "FusedRMSNorm", "MixedFusedRMSNorm")}
_NORM_FUNCTIONS = {name: f"{_OPS}.norm:{name}" for name in (
    "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction",
    "fused_layer_norm_affine", "fused_layer_norm", "mixed_dtype_fused_layer_norm_affine",
    "fused_rms_norm_affine", "fused_rms_norm", "mixed_dtype_fused_rms_norm_affine")}

APEX: ShimTable = {
    "apex": ShimSpec("apex's fused optimizers and norms on the target", children=("optimizers", "normalization"),
                     hints={
                         "amp": f"apex.amp is deprecated upstream; {_AMP}",
                         "fp16_utils": _AMP,
                         "parallel": "use torch.nn.parallel.DistributedDataParallel and torch.nn.SyncBatchNorm",
                         "transformer": "use megatron-core",
                         "*": "the shim provides apex.optimizers (FusedAdam, FusedSGD), apex.normalization, "
                              "apex.multi_tensor_apply and apex.contrib.layer_norm"}),
    "apex.optimizers": ShimSpec("FusedAdam, FusedSGD", {"FusedAdam": _ADAM, "FusedSGD": _SGD}, hints=_OPTIM_HINTS),
    "apex.optimizers.fused_adam": ShimSpec("FusedAdam", {"FusedAdam": _ADAM}, hints=_OPTIM_HINTS),
    "apex.optimizers.fused_sgd": ShimSpec("FusedSGD", {"FusedSGD": _SGD}, hints=_OPTIM_HINTS),
    "apex.normalization": ShimSpec(
        "fused layer/RMS norms", _NORM_MODULES, children=("fused_layer_norm",),
        hints={"*": "the shim provides FusedLayerNorm, MixedFusedLayerNorm, FusedRMSNorm and MixedFusedRMSNorm"}),
    "apex.normalization.fused_layer_norm": ShimSpec(
        "fused layer/RMS norms", {**_NORM_MODULES, **_NORM_FUNCTIONS},
        hints={"manual_rms_norm": "use torch.nn.functional.rms_norm",
               "*": "the shim provides the norm modules, their autograd functions and functional forms"}),
    "apex.multi_tensor_apply": ShimSpec(
        "multi_tensor_applier", {"multi_tensor_applier": f"{_OPS}.multi_tensor:multi_tensor_applier",
                                 "MultiTensorApply": f"{_OPS}.multi_tensor:MultiTensorApply"},
        hints={"*": "the shim provides multi_tensor_applier"}),
    "apex.multi_tensor_apply.multi_tensor_apply": ShimSpec(
        "MultiTensorApply", {"MultiTensorApply": f"{_OPS}.multi_tensor:MultiTensorApply"},
        hints={"*": "the shim provides MultiTensorApply"}),
    "apex.contrib": ShimSpec("apex.contrib.layer_norm only", hints={
        "*": "only apex.contrib.layer_norm is provided; for the other contrib kernels use torch "
             "(e.g. torch.nn.functional.cross_entropy for xentropy)"}),
    "apex.contrib.layer_norm": ShimSpec("FastLayerNorm", {"FastLayerNorm": f"{_OPS}.norm_apex:FastLayerNorm"},
                                        hints={"*": "the shim provides FastLayerNorm"}),
    "apex.contrib.layer_norm.layer_norm": ShimSpec(
        "FastLayerNorm, FastLayerNormFN", {"FastLayerNorm": f"{_OPS}.norm_apex:FastLayerNorm",
                                           "FastLayerNormFN": f"{_OPS}.norm:FastLayerNormFN"},
        hints={"*": "the shim provides FastLayerNorm and FastLayerNormFN"}),
}

AMP_C: ShimTable = {
    "amp_C": ShimSpec(
        "multi-tensor ops with apex's overflow-flag semantics",
        {name: f"{_OPS}.multi_tensor:{name}" for name in (
            "multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_axpby", "multi_tensor_adam",
            "multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master", "multi_tensor_sgd")},
        hints={"multi_tensor_l2norm_mp": "use multi_tensor_l2norm (it accumulates in fp32)",
               "multi_tensor_l2norm_scale": "call multi_tensor_scale, then multi_tensor_l2norm",
               "multi_tensor_unscale_l2norm": "call multi_tensor_scale with 1/scale, then multi_tensor_l2norm",
               "*": "the shim provides multi_tensor_scale, multi_tensor_l2norm, "
                    "multi_tensor_adam(_capturable(_master)), multi_tensor_sgd and multi_tensor_axpby"}),
}

FUSED_LAYER_NORM_CUDA: ShimTable = {
    "fused_layer_norm_cuda": ShimSpec(
        "apex's layer/RMS norm extension functions",
        {name: f"{_OPS}.norm_cuda:{name}" for name in (
            "forward_affine", "forward_affine_mixed_dtypes", "forward", "backward_affine", "backward",
            "rms_forward_affine", "rms_forward_affine_mixed_dtypes", "rms_forward", "rms_backward_affine",
            "rms_backward")},
        hints={"*": "the shim provides forward/backward(_affine), rms_forward/rms_backward(_affine) and the "
                    "*_mixed_dtypes forwards"}),
}

_FLASH = {name: f"{_OPS}.attention:{name}" for name in (
    "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache")}
_FLASH_PROVIDED = ("the shim provides flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func, "
                   "flash_attn_kvpacked_func, their varlen variants, flash_attn_with_kvcache and "
                   "flash_attn.layers.rotary.apply_rotary_emb")

FLASH_ATTN: ShimTable = {
    # __version__: the flash-attn 2 API level the adaptor implements; package metadata stays absent
    "flash_attn": ShimSpec("flash-attn 2's API on the target", _FLASH, children=("flash_attn_interface",),
                           version="2.8.3", hints={
                               "bert_padding": "unpad with attention_mask.flatten().nonzero() and call "
                                               "flash_attn_varlen_func",
                               "ops": "the fused ops are not provided; use torch's (e.g. "
                                      "torch.nn.functional.layer_norm)",
                               "modules": "build the model from torch.nn or megatron-core modules",
                               "losses": "use torch.nn.functional.cross_entropy",
                               "*": _FLASH_PROVIDED}),
    "flash_attn.flash_attn_interface": ShimSpec("flash-attn 2's functions", _FLASH, hints={
        "_flash_attn_forward": "private kernels are not provided; call flash_attn_func",
        "_flash_attn_backward": "private kernels are not provided; autograd differentiates flash_attn_func",
        "_flash_attn_varlen_forward": "private kernels are not provided; call flash_attn_varlen_func",
        "*": _FLASH_PROVIDED}),
    "flash_attn.layers": ShimSpec("flash_attn.layers.rotary only",
                                  hints={"*": "only flash_attn.layers.rotary is provided"}),
    "flash_attn.layers.rotary": ShimSpec(
        "apply_rotary_emb", {"apply_rotary_emb": f"{_OPS}.rope:apply_rotary_emb",
                             "apply_rotary_emb_func": f"{_OPS}.rope:apply_rotary_emb",
                             "apply_rotary_emb_torch": f"{_OPS}.rope:apply_rotary_emb_torch",
                             "rotate_half": f"{_OPS}.rope:rotate_half"},
        hints={"RotaryEmbedding": "compute cos/sin yourself and call apply_rotary_emb (provided)",
               "apply_rotary_emb_qkv_": "split qkv and call apply_rotary_emb on q and k",
               "apply_rotary_emb_kv_": "call apply_rotary_emb on k",
               "*": "the shim provides apply_rotary_emb, apply_rotary_emb_func, apply_rotary_emb_torch and "
                    "rotate_half"}),
}

TABLES: tuple[ShimTable, ...] = (APEX, AMP_C, FUSED_LAYER_NORM_CUDA, FLASH_ATTN)


def shim_patches(backend: Any) -> list[Any]:
    """MODULE patches serving every module of :data:`TABLES` (``backend`` decides the reported action)."""
    from ..patch import Action, ModuleShim

    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED
    patches = []
    for table in TABLES:
        build = ShimBuilder(table)  # one per apply: the objects each module shares
        patches += [ModuleShim(target=name, make=build, action=action,
                               reason=f"{name.split('.')[0]} is CUDA-only; serve ascend_patch's adapted {name} while "
                                      "it is not installed")
                    for name in table]
    return patches
