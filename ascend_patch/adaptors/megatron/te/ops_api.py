"""``transformer_engine.pytorch.ops``: TE's operation-based API, present as names and refused when used."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ....unsupported import UnsupportedOption
from . import OPS_ACTIVATIONS, OPS_OPERATIONS

__all__ = ["FusibleOperation", "Sequential", *OPS_ACTIVATIONS, *OPS_OPERATIONS]

# what in megatron-core builds these, by the qualified name of the building function's class or function
_BUILDERS = (
    ("TEFusedMLP", "megatron-core's TEFusedMLP, the MLP of --use-transformer-engine-op-fuser"),
    ("TEActivationOp", "megatron-core's TE activation, selected by --use-te-activation-func"),
    ("_make_activation_op", "megatron-core's TEFusedMLP, the MLP of --use-transformer-engine-op-fuser"),
    ("Fused", "megatron-core's fused TE-ops MoE experts"),
)


def _built_by() -> str:
    """Who is building an op: the first megatron frame's class/function, as the flag that selects it."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("megatron."):
            where = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            for marker, said in _BUILDERS:
                if marker in where:
                    return f"{said} ({module}.{where})"
            return f"{module}.{where}"
        frame = frame.f_back
    return "code outside megatron-core"


def _refusal(name: str) -> UnsupportedOption:
    who = _built_by()
    named = any(said in who for _, said in _BUILDERS)
    what_to_do = ("Turn that option off" if named else "megatron-core builds these for "
                  "--use-transformer-engine-op-fuser and --use-te-activation-func: drop the one you use")
    return UnsupportedOption(
        f"transformer_engine.pytorch.ops.{name} was built by {who}: TE's operation-based API is not provided "
        f"by ascend_patch's transformer_engine layer (its names exist so that megatron-core imports). {what_to_do}; "
        "megatron-core then builds its MLP and activation from TE linears and torch")


class FusibleOperation(torch.nn.Module):
    """TE's base of fusible operations; refused when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _refusal(type(self).__name__)


class Sequential(torch.nn.Module):
    """TE's op-fuser container; refused when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _refusal(type(self).__name__)


def _operation(name: str) -> type[FusibleOperation]:
    return type(name, (FusibleOperation,), {"__module__": __name__, "__qualname__": name,
                                            "__doc__": f"TE's ``ops.{name}``; refused when built."})


for _name in (*OPS_ACTIVATIONS, *OPS_OPERATIONS):
    globals()[_name] = _operation(_name)
del _name
