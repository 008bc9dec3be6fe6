"""``--spec NAME`` in Megatron-LM's own entry point (``pretrain_gpt.py --spec qwen3``).

Megatron-LM's ``gpt_builders.gpt_builder`` passes ``args.spec`` to megatron-core's
``spec_utils.import_module``, which takes Megatron's ``module attribute`` pair only: one word
fails with ``ValueError: not enough values to unpack``. With the patch a single word is a model
family registered with ascend_patch (built in: gpt, llama, mixtral, qwen2, qwen3, qwen3_moe; or a plugin's), whose
layer spec is built for the run's arguments (``--normalization``, ``--qk-layernorm``); an unknown
name fails listing the known ones. Two words (or anything else) go to megatron-core unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from ....errors import UnsupportedSetting

__all__ = ["import_module"]


def _one_name(path: Any) -> str | None:
    if isinstance(path, str):
        parts = path.split()
    else:
        try:
            parts = list(path)
        except TypeError:
            return None
    return parts[0] if len(parts) == 1 and isinstance(parts[0], str) and " " not in parts[0] else None


def _run_args() -> Any:
    """Megatron-LM's parsed arguments, when Megatron-LM is running (None otherwise)."""
    global_vars = sys.modules.get("megatron.training.global_vars")
    args = getattr(global_vars, "_GLOBAL_ARGS", None) if global_vars is not None else None
    return args


def import_module(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``spec_utils.import_module(path)``: a registered family's layer spec for a one-word path."""
    path = args[0] if args else kwargs.get("module_path")
    name = _one_name(path)
    if name is None:
        return wrapped(*args, **kwargs)
    from ....models.registry import resolve_spec

    family = resolve_spec(name)  # an unknown name raises, listing the known ones
    if family.layer_spec is None:
        raise UnsupportedSetting(f"--spec {name}: the {family.name} family has no megatron-core layer spec "
                                 "(it only converts checkpoints); give --spec a family that builds models, or "
                                 "Megatron's 'module attribute' form")
    return family.layer_spec(_run_args())
