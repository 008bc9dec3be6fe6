"""Megatron-LM's own formula for the same launch (``megatron/training/theoretical_memory_usage.py``), for comparison.

The estimate records what the launch's Megatron-LM computes for its own arguments: the weight
and optimizer bytes of the most loaded shard, and the activation bytes of the first stage with
the function its ``report_theoretical_memory`` would pick (``releases.FORMULA_ACTIVATIONS``).
They are printed next to the estimate and compared in docs/memory.md; nothing is derived
from them.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

from .megatron_names import FORMULA_ACTIVATIONS, FORMULA_MODULE

__all__ = ["megatron_formula"]


def megatron_formula(args: Any, num_microbatches: int | None) -> dict[str, int | None]:
    """``{"weight_and_optimizer_bytes", "activations_bytes"}`` from the launch's formula (None where it has none)."""
    try:
        module = importlib.import_module(FORMULA_MODULE)
    except ImportError:
        return {"weight_and_optimizer_bytes": None, "activations_bytes": None}
    args = copy.copy(args)  # the formula sets num_query_groups on the namespace it gets
    try:
        weights = int(module.compute_weight_and_optimizer_memory(args))
    except (AttributeError, TypeError, AssertionError, ZeroDivisionError):
        weights = None
    activations = None
    for condition, name in FORMULA_ACTIVATIONS:
        function = getattr(module, name, None)
        applies = bool(args.sequence_parallel and args.recompute_granularity == "selective")
        if function is not None and (condition == "any" or applies):
            try:
                activations = int(function(args, num_microbatches))
            except (AttributeError, TypeError, AssertionError, ZeroDivisionError):
                activations = None
            break
    return {"weight_and_optimizer_bytes": weights, "activations_bytes": activations}
