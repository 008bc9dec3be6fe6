"""megatron-core's ``jit_fuser`` (``torch.compile``) as an eager pass-through on the targets, and why."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...patch import Action, Patch, Replace
from .releases import COMPILED_AT_IMPORT, COMPILED_DIRECTLY

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
    """``jit_fuser`` -> eager, and each function already compiled at import back to eager.

    ``jit_fuser`` decorates ~40 small elementwise functions (bias-GeLU, bias-SwiGLU, bias-dropout-add,
    cross-entropy pieces, L2 norm) at import. On cpu Inductor would compile C++ for each (a C++
    compiler on the host, 8-14 s per process, recompiling per shape) for memory-bound ops the host runs
    eagerly anyway; on npu stock Inductor has no code generator (that needs torchair) and the fusions
    that matter come from ascend_patch's ops (MindSpeed makes the same choice). The semantics are
    unchanged: the same functions, run eagerly. Functions compiled before the patch (megatron-core
    imported first; :data:`COMPILED_AT_IMPORT`) get their eager original back, under the ``jit_fuser``
    row of the table; functions decorated later follow ``jit_fuser``'s value in their module.
    """
    api = "megatron.core.jit.jit_fuser (torch.compile)"
    patches = [Replace("megatron.core.jit:jit_fuser", _REASON, replacement=eager,
                       action=Action.EMULATED, api=api, count_calls=False,
                       rebind=False)]  # the original *is* torch.compile: never re-bind torch's own name
    for module, attr in COMPILED_AT_IMPORT:
        original = _compiled_now(module, attr)
        if original is not None:  # same entry point and behaviour as the jit_fuser row of the table
            patches.append(Replace(f"{module}:{attr}", _REASON, replacement=original,
                                   action=Action.EMULATED, api=api, count_calls=False))
    # methods decorated with torch.compile itself, not jit_fuser: eager whenever their module is imported
    patches += [Replace(f"{module}:{attr}", _REASON, make=_eager_of, action=Action.EMULATED, api=api,
                        count_calls=False) for module, attr in COMPILED_DIRECTLY]
    return patches


def _eager_of(compiled: Any) -> Any:
    """The function ``torch.compile`` wrapped (``compiled`` itself when it is not a compiled function)."""
    return getattr(compiled, "_torchdynamo_orig_callable", compiled)
