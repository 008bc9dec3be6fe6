"""The ``transformer_engine`` shim: :data:`~ascend_patch.adaptors.megatron.te.SURFACE` served while TE is missing."""

from __future__ import annotations

import sys
from typing import Any

from ....shim import ShimBuilder
from . import SURFACE

__all__ = ["te_hidden_from", "te_shim_patches"]

_MEGATRON_TE = "megatron.core.extensions.transformer_engine"


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


def te_shim_patches(backend: Any) -> list[Any]:
    """MODULE patches serving every module of :data:`SURFACE` (``backend`` decides the reported action)."""
    from ....patch import Action, ModuleShim

    build = ShimBuilder(SURFACE)  # one per apply: one class per name
    action = Action.TRANSLATED if backend.name == "npu" else Action.EMULATED
    hidden = te_hidden_from()
    reason = ("transformer_engine is CUDA-only; serve ascend_patch's adapted {} while it is not installed (not to "
              "megatron-core when it was imported before ascend_patch without it: it keeps its local path)")
    return [ModuleShim(target=name, make=build, action=action, hidden_from=hidden, reason=reason.format(name))
            for name in SURFACE]
