"""megatron-core's ``jit_fuser`` on the targets: eager execution, and why.

``megatron.core.jit.jit_fuser`` is ``torch.compile`` on torch >= 2.2. It decorates ~40
small elementwise functions (bias-GeLU, bias-SwiGLU, bias-dropout-add, cross-entropy
pieces, L2 norm) at import time.

* cpu: Inductor generates and compiles C++ for each of them on first call: it needs a
  C++ compiler on the host and costs 8-14 s per process per run, recompiling for each new
  shape, while the eager versions of these memory-bound elementwise ops are what the host
  runs anyway. The fused *semantics* are unchanged (same functions, run eagerly).
* npu: stock Inductor has no npu code generator (that needs torchair), and the fusions
  that matter on Ascend (SwiGLU, RoPE, RMSNorm, softmax) are routed to torch_npu kernels
  by ``ascend_patch.ops`` (RMSNorm through :mod:`.norms`, which builds its adaptor on
  ``npu_rms_norm``); MindSpeed makes the same choice.

So on both targets ``jit_fuser`` becomes a pass-through decorator. Of the functions
megatron-core 0.16 decorates at import (:data:`COMPILED_AT_IMPORT`), those already compiled
when the patches are applied (megatron-core imported first) get one REPLACE patch each that
puts back the eager original, so the order of imports does not matter. They are shown
under the ``jit_fuser`` entry point, with its reason. Functions decorated
later inside other functions (the MoE experts' activations) follow ``jit_fuser``'s value
in their module, which is eager when megatron-core is imported after the patch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...patch import Action, Patch, Replace
from .releases import COMPILED_AT_IMPORT, needed_on

__all__ = ["COMPILED_AT_IMPORT", "compiled_functions", "eager", "jit_patches"]

_REASON = ("torch.compile of megatron's small fused elementwise functions: eager on the target "
           "(cpu: Inductor needs a C++ compiler and costs seconds per process; npu: no Inductor "
           "backend without torchair, and the fused kernels come from ascend_patch.ops)")


def eager(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``jit_fuser`` on the target: returns the function unchanged (also as ``@eager(...)``)."""
    if fn is None:
        return lambda f: f
    return fn


def compiled_functions() -> Iterator[tuple[str, str, Callable[..., Any]]]:
    """(module, attribute path, eager original) for each torch.compile'd function megatron-core
    defined in a module that is imported now (a scan; the patches use COMPILED_AT_IMPORT)."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "megatron.core" or name.startswith("megatron.core.")):
            continue
        for attr, value in list(vars(module).items()):
            original = getattr(value, "_torchdynamo_orig_callable", None)
            if original is not None and getattr(original, "__module__", None) == name:
                yield name, attr, original
            elif isinstance(value, type) and value.__module__ == name:
                for meth, member in list(vars(value).items()):
                    original = getattr(member, "_torchdynamo_orig_callable", None)
                    if original is not None:
                        yield name, f"{attr}.{meth}", original


def _compiled_now(module: str, path: str) -> Callable[..., Any] | None:
    owner: Any = sys.modules.get(module)
    if owner is None:
        return None  # imported later, it is decorated by the patched (eager) jit_fuser
    for part in path.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return getattr(owner, "_torchdynamo_orig_callable", None)


def jit_patches() -> list[Patch]:
    """``jit_fuser`` -> eager, and each function already compiled at import back to eager."""
    api = "megatron.core.jit.jit_fuser (torch.compile)"
    patches = [Replace("megatron.core.jit:jit_fuser", _REASON, replacement=eager,
                       **needed_on(),  action=Action.EMULATED, api=api, count_calls=False,
                       rebind=False)]  # the original *is* torch.compile: never re-bind torch's own name
    for module, attr in COMPILED_AT_IMPORT:
        original = _compiled_now(module, attr)
        if original is not None:  # same entry point and behaviour as the jit_fuser row of the table
            patches.append(Replace(f"{module}:{attr}", _REASON, replacement=original,
                                   **needed_on(),  action=Action.EMULATED, api=api,
                                   count_calls=False))
    return patches
