"""What Megatron-LM's ``initialize_megatron`` compiles, on targets where nothing needs compiling.

``_compile_dependencies`` runs on every launch:

* ``megatron.core.datasets.utils.compile_helpers()`` on rank 0 runs ``make`` in megatron-core's
  ``datasets`` folder. A pip-installed megatron-core ships the compiled ``helpers_cpp``
  extension and no Makefile, so ``make`` fails and Megatron exits. When the compiled module
  imports, there is nothing to build and the call returns; otherwise the original runs (a
  source checkout with its Makefile still builds).
* ``megatron.legacy.fused_kernels.load(args)`` asks ``nvcc`` for its CUDA version (and fails
  without CUDA: ``NoneType + str``). In 0.16 it builds no kernel any more; the fused softmax,
  norms and the rest are served by ascend_patch's ops on npu and cpu. It becomes a no-op.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["HELPERS_MODULE", "compile_helpers", "load_fused_kernels"]

HELPERS_MODULE = "megatron.core.datasets.helpers_cpp"


def compile_helpers(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Skip ``make`` when megatron-core's compiled dataset helpers already import."""
    try:
        importlib.import_module(HELPERS_MODULE)
    except ImportError:
        return wrapped(*args, **kwargs)  # a source tree: build them as Megatron does
    return None


def load_fused_kernels(args: Any = None) -> None:
    """``megatron.legacy.fused_kernels.load`` on npu/cpu: nothing to build (the ops are ascend_patch's)."""
    return None
