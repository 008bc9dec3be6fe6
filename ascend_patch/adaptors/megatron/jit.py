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
  by ``ascend_patch.ops``; MindSpeed makes the same choice.

So on both targets ``jit_fuser`` becomes a pass-through decorator. Functions compiled
before the patch (megatron-core imported before ascend_patch was applied) are put back
to their eager originals, one REPLACE patch each, so the order of imports does not matter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...patch import Action, Patch, PatchKind
from . import PACKAGE, VERSIONS

__all__ = ["eager", "jit_patches", "compiled_functions"]

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
    defined in a module that is already imported."""
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


def jit_patches() -> list[Patch]:
    """``jit_fuser`` -> eager, plus already-compiled functions back to eager."""
    patches = [Patch("megatron.core.jit:jit_fuser", PatchKind.REPLACE, _REASON, replacement=eager,
                     package=PACKAGE, versions=VERSIONS, action=Action.EMULATED,
                     api="megatron.core.jit.jit_fuser (torch.compile)", count_calls=False,
                     rebind=False)]  # the original *is* torch.compile: never re-bind torch's own name
    if "megatron.core.jit" in sys.modules:
        for module, attr, original in compiled_functions():
            patches.append(Patch(f"{module}:{attr}", PatchKind.REPLACE,
                                 "compiled by jit_fuser before ascend_patch was applied: back to eager",
                                 replacement=original, package=PACKAGE, versions=VERSIONS,
                                 action=Action.EMULATED, count_calls=False))
    return patches
