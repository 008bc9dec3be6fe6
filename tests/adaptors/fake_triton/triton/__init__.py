"""TEST DOUBLE of the triton package (the wheel every CUDA build of torch installs), for child processes.

It holds what torch's Inductor imports from triton (torch/_inductor/runtime/triton_compat.py) and
models one behaviour of the real wheel: ``triton.runtime.driver.driver.active`` picks the CUDA driver
when ``torch.cuda.is_available()`` says True (triton's nvidia backend asks torch exactly that), and
that driver cannot start on a host without libcuda.so, raising what triton 3.x raises there. No
kernel can be compiled or launched with it.
"""

import sys
import types

__version__ = "3.9.0"


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


class Config:
    def __init__(self, kwargs, num_warps=4, num_stages=2, num_ctas=1, maxnreg=None, pre_hook=None):
        self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages


class _Error(Exception):
    pass


def _no_kernels(*args, **kwargs):
    raise RuntimeError("test double of triton: no kernel can be compiled or launched")


class _Kernel:
    """What ``@triton.jit`` makes: a placeholder that refuses to run."""

    def __init__(self, fn):
        self.fn, self.__name__ = fn, getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid):
        return _no_kernels

    __call__ = _no_kernels


def jit(fn=None, **options):
    return _Kernel(fn) if fn is not None else _Kernel


def autotune(*args, **kwargs):
    return lambda fn: fn


heuristics = autotune


class _CudaDriver:
    """Models triton's nvidia driver: active when torch says CUDA is available; cannot start without libcuda."""

    @staticmethod
    def is_active():
        import torch

        return torch.cuda.is_available() and torch.version.hip is None

    def __init__(self):
        raise AssertionError("libcuda.so cannot found!\nPlease make sure GPU is set up and then run "
                             '"/sbin/ldconfig" (requires sudo) to refresh the linker cache.')


class _DriverConfig:
    @property
    def active(self):
        drivers = [d for d in (_CudaDriver,) if d.is_active()]
        if len(drivers) != 1:
            raise RuntimeError(f"{len(drivers)} active drivers ({drivers}). There should only be one.")
        return drivers[0]()


def _view(input, *shape, _semantic=None):
    raise RuntimeError("test double of triton")


for _name in ("language", "language.core", "language.math", "language.extra", "language.standard", "compiler",
              "compiler.compiler", "runtime", "runtime.autotuner", "runtime.jit", "runtime.driver", "runtime.cache",
              "backends", "backends.compiler"):
    _module(f"triton.{_name}")
def _language_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return object  # tl.float32, tl.int1 and the like: only named in kernel bodies, which never run


language.__getattr__ = _language_attr  # noqa: F821  (made above)
language.constexpr = lambda value: value  # noqa: F821
language.core.view = _view  # noqa: F821
language.tensor = language.dtype = object  # noqa: F821
compiler.CompiledKernel = type("CompiledKernel", (), {})  # noqa: F821
compiler.compiler.triton_key = lambda: "test-double-triton-3.9.0"  # noqa: F821
compiler.compiler.make_backend = _no_kernels  # noqa: F821
runtime.autotuner.OutOfResources = type("OutOfResources", (_Error,), {})  # noqa: F821
runtime.autotuner.Autotuner = type("Autotuner", (), {})  # noqa: F821
runtime.jit.JITFunction = type("JITFunction", (), {})  # noqa: F821
runtime.jit.KernelInterface = type("KernelInterface", (), {})  # noqa: F821
runtime.driver.driver = _DriverConfig()  # noqa: F821
backends.backends = {"nvidia": types.SimpleNamespace(driver=_CudaDriver)}  # noqa: F821
