"""megatron-core with ascend_patch's transformer_engine layer: FP8 asked for fails at configuration time.

megatron-core builds its TE layer spec on the ``transformer_engine`` shim (:mod:`ascend_patch.adaptors.megatron.te`)
without patches. FP8/FP4 training would only fail at the first forward, deep in
``get_fp8_context`` (the recipe, then ``fp8_autocast``), after the model and optimizer are built.
The patch checks ``TransformerConfig`` as it is made (Megatron-LM makes it from its arguments
before building anything) and refuses ``fp8``, ``fp4``, ``fp8_param`` and ``fp4_param``, naming
Megatron-LM's flags and what to use instead. It applies only while the real Transformer Engine is
missing (the shim is what megatron would run).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ...patch import Action, Patch, Wrap
from .releases import needed_on

__all__ = ["refuse_fp8_config", "te_patches"]

_FIELDS = (("fp8", "--fp8-format"), ("fp8_param", "--fp8-param-gather"), ("fp4", "--fp4-format"),
           ("fp4_param", "--fp4-param"))


def _real_te_installed() -> bool:
    spec = importlib.util.find_spec("transformer_engine")
    return spec is not None and not str(spec.origin or "").startswith("ascend_patch shim")


def refuse_fp8_config(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``TransformerConfig.__post_init__`` that first refuses FP8/FP4 settings the target cannot run."""
    asked = [(name, flag, getattr(instance, name, None)) for name, flag in _FIELDS if getattr(instance, name, None)]
    if asked and not _real_te_installed():
        from ...backend import active_backend
        from .te.fp8 import fp8_unavailable

        backend = active_backend()
        what = ", ".join(f"TransformerConfig.{name}={value!r} ({flag})" for name, flag, value in asked)
        raise fp8_unavailable(what, backend.name if backend is not None else None)
    return wrapped(*args, **kwargs)


def te_patches() -> list[Patch]:
    return [Wrap(
        "megatron.core.transformer.transformer_config:TransformerConfig.__post_init__",
        "FP8/FP4 needs Transformer Engine's FP8 kernels, which the targets lack: refuse it when the config is "
        "made, naming the flag, not at the first forward", wrapper=refuse_fp8_config, **needed_on(),
         action=Action.UNSUPPORTED, api="TransformerConfig(fp8=...)", count_calls=False)]
