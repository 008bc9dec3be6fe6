"""TEST DOUBLE: tensors on an ``npu`` device, backed by host memory, for child processes only.

torch lets a Python backend take the privateuse1 dispatch key
(``torch.utils.backend_registration._setup_privateuseone_for_python_backend``). This
module renames privateuse1 to "npu" as torch_npu does, registers a
:class:`npu_double.FakeNpuModule` as ``torch.npu``, and makes ``torch.empty(...,
device="npu:N")`` return an :class:`NpuTensor`: a tensor whose ``device`` is
``npu:N`` and whose data is a host tensor. Every op on it runs on the host copy.
Nothing here measures or imitates NPU numerics; it only lets device placement be
observed through public torch APIs. The rename cannot be undone: never install
this in the pytest process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from npu_double import FakeNpuModule

__all__ = ["NpuTensor", "install"]


class NpuTensor(torch.Tensor):
    """A tensor on ``npu:N`` whose data lives in the host tensor ``host``."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor, index: int) -> NpuTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls, host.size(), strides=host.stride(), storage_offset=host.storage_offset(),
            dtype=host.dtype, device=torch.device("npu", index), requires_grad=host.requires_grad)

    def __init__(self, host: torch.Tensor, index: int) -> None:
        self.host = host

    def __repr__(self) -> str:  # torch's repr would print through the dispatcher
        return f"NpuTensor({self.host!r}, device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        index = None
        wanted = kwargs.get("device")
        if wanted is not None:
            wanted = torch.device(wanted)
            if wanted.type == "npu":
                index = wanted.index or 0
                kwargs["device"] = torch.device("cpu")

        def unwrap(x: Any) -> Any:
            nonlocal index
            if isinstance(x, NpuTensor):
                if index is None:
                    index = x.device.index
                return x.host
            return x

        host_args, host_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        out = func(*host_args, **host_kwargs)
        if wanted is not None and wanted.type == "cpu":
            return out  # a transfer to the host: a plain host tensor

        def wrap(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or isinstance(x, NpuTensor):
                return x
            for arg, host in zip(args, host_args):  # in-place ops answer their own argument
                if host is x and isinstance(arg, NpuTensor):
                    return arg
            return NpuTensor(x, index or 0)

        return tree_map(wrap, out)


def _host(x: Any) -> Any:
    return x.host if isinstance(x, NpuTensor) else x


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    host = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return NpuTensor(host, device.index or 0)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return NpuTensor(torch.empty_strided(size, stride, dtype=dtype), device.index or 0)


def _copy_from(self, dst, non_blocking=False):
    _host(dst).copy_(_host(self))
    return dst


_LIBRARY: list[Any] = []  # kept alive: dropping the Library unregisters its kernels


def install(module: FakeNpuModule | None = None) -> FakeNpuModule:
    """Set up the "npu" device type with ``module`` as ``torch.npu``; returns the module."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    module = module if module is not None else FakeNpuModule()
    _setup_privateuseone_for_python_backend("npu", backend_module=module)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    # torch_npu registers autocast casts for npu; the double only lets ops through autocast
    through = torch.library.Library("_", "IMPL")
    through.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _LIBRARY.extend((lib, through))
    return module
