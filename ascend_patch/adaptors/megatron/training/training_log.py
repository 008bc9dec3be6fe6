"""Each iteration's numbers at full precision, from Megatron-LM's own training loop.

Megatron-LM prints ``lm loss: 5.541634E+00 | ... | grad norm: 1.429``: seven significant digits
for losses and three decimals for the gradient norm, fine for watching a run, too coarse to
compare an npu run with its GPU reference (or two layouts of the same model) step by step.
With ``ASCEND_PATCH_TRAINING_LOG=FILE``, ``megatron.training.training.training_log`` also
appends one JSON line per iteration to ``FILE``::

    {"iteration": 3, "losses": {"lm loss": 5.354800701141357}, "grad_norm": 1.2349..., "learning_rate": 0.0,
     "loss_scale": 1.0, "skipped": false, "params_norm": null, "num_zeros_in_grad": null}

with the values Megatron is about to print (each loss reduced over data-parallel ranks, as
``float`` of the tensor: the exact fp32 value). The rank that writes is the one that prints
Megatron's log line (the last rank, on the last pipeline stage). NaN and infinity are written as
JSON's ``NaN``/``Infinity`` extensions (Python's ``json`` reads them).
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any

__all__ = ["TrainingLog", "iteration_record"]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.float().sum().item() if hasattr(value, "float") else value.item()
    return float(value)


def iteration_record(loss_dict: dict[str, Any], iteration: int, learning_rate: Any, loss_scale: Any,
                     skipped_iter: Any, grad_norm: Any, params_norm: Any = None,
                     num_zeros_in_grad: Any = None) -> dict[str, Any]:
    """The JSON record of one iteration (losses as Megatron reduced them for its log line)."""
    losses = {key: _number(value) for key, value in loss_dict.items()}
    zeros = _number(num_zeros_in_grad)
    return {"iteration": int(iteration), "losses": losses, "grad_norm": _number(grad_norm),
            "learning_rate": _number(learning_rate), "loss_scale": _number(loss_scale),
            "skipped": bool(skipped_iter), "params_norm": _number(params_norm),
            "num_zeros_in_grad": None if zeros is None or math.isnan(zeros) else int(zeros)}


class TrainingLog:
    """The wrapper of ``training_log``: calls it, then appends the iteration's record to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature: inspect.Signature | None = None

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        if self._signature is None:
            self._signature = inspect.signature(wrapped)
        bound = self._signature.bind(*args, **kwargs).arguments
        if bound.get("loss_dict") and _is_printing_rank():
            record = iteration_record(bound["loss_dict"], bound["iteration"], bound.get("learning_rate"),
                                      bound.get("loss_scale"), bound.get("skipped_iter"), bound.get("grad_norm"),
                                      bound.get("params_norm"), bound.get("num_zeros_in_grad"))
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return result


def _is_printing_rank() -> bool:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return True
    return dist.get_rank() == dist.get_world_size() - 1  # megatron's print_rank_last
