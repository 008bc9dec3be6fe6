"""``torch.backends.cuda`` / ``torch.backends.cudnn`` TF32 switches onto torch_npu's HF32 ones (npu only).

CUDA code opts into reduced-precision fp32 math with ``allow_tf32``; on Ascend the
counterpart is HF32, switched by ``torch.npu.matmul.allow_hf32`` and
``torch.npu.conv.allow_hf32`` (torch_npu's documented API). On npu, reading or
setting the CUDA flag reads or sets the NPU one. A torch_npu without these switches
gets no patch (the CUDA flags then stay torch's own and change nothing on the NPU).
On the cpu target the flags are left alone: the host has neither TF32 nor HF32.
"""

from __future__ import annotations

from typing import Any

from ...backend import Backend
from ...patch import Patch, Replace, replacing

__all__ = ["FLAG_COUNTERPARTS", "backend_flag_patches"]

# CUDA flag -> (device-module group, NPU switch), i.e. torch.backends.cuda.matmul.allow_tf32
# -> torch.npu.matmul.allow_hf32.
FLAG_COUNTERPARTS = {
    "torch.backends.cuda.matmul.allow_tf32": ("matmul", "allow_hf32"),
    "torch.backends.cudnn.allow_tf32": ("conv", "allow_hf32"),
}
_NPU_ONLY = frozenset({"npu"})


def _switch_group(device_module: Any, group: str) -> Any:
    owner = getattr(device_module, group, None)
    return owner if owner is not None and hasattr(owner, "allow_hf32") else None


def _cublas_getattr(switches: Any) -> Any:
    def make(original: Any) -> Any:
        @replacing(original)
        def __getattr__(self: Any, name: str) -> Any:
            if name == "allow_tf32":
                return switches.allow_hf32
            return original(self, name)

        return __getattr__

    return make


def _cublas_setattr(switches: Any) -> Any:
    def make(original: Any) -> Any:
        @replacing(original)
        def __setattr__(self: Any, name: str, value: Any) -> Any:
            if name == "allow_tf32":
                switches.allow_hf32 = bool(value)
                return None
            return original(self, name, value)

        return __setattr__

    return make


def _conv_flag(switches: Any) -> property:
    def get(self: Any) -> bool:
        return switches.allow_hf32

    def set_(self: Any, value: Any) -> None:
        switches.allow_hf32 = bool(value)

    return property(get, set_, doc="torch.backends.cudnn.allow_tf32 -> torch.npu.conv.allow_hf32")


def backend_flag_patches(target: Backend) -> list[Patch]:
    """The TF32 -> HF32 flag patches the target's device module supports (none on cpu)."""
    if target.name != "npu":
        return []
    patches = []
    matmul = _switch_group(target.device_module, "matmul")
    if matmul is not None:
        why = "torch.backends.cuda.matmul.allow_tf32 reads and sets torch.npu.matmul.allow_hf32"
        patches += [
            Replace("torch.backends.cuda:cuBLASModule.__getattr__", why,
                    make=_cublas_getattr(matmul), backends=_NPU_ONLY, count_calls=False,
                    api="torch.backends.cuda.matmul.allow_tf32 (read)"),
            Replace("torch.backends.cuda:cuBLASModule.__setattr__", why,
                    make=_cublas_setattr(matmul), backends=_NPU_ONLY, count_calls=False,
                    api="torch.backends.cuda.matmul.allow_tf32"),
        ]
    conv = _switch_group(target.device_module, "conv")
    if conv is not None:
        patches.append(Replace("torch.backends.cudnn:CudnnModule.allow_tf32",
                               "torch.backends.cudnn.allow_tf32 reads and sets torch.npu.conv.allow_hf32",
                               replacement=_conv_flag(conv), backends=_NPU_ONLY, count_calls=False,
                               api="torch.backends.cudnn.allow_tf32"))
    return patches
