"""``CUDA_DEVICE_MAX_CONNECTIONS`` in Megatron-LM's argument checks, on targets where it means nothing.

On a CUDA GPU before Blackwell, Megatron-LM's ``validate_args`` asserts
``CUDA_DEVICE_MAX_CONNECTIONS=1`` whenever tensor or context parallelism is on: with a single
hardware work queue, a communication kernel launched before a GEMM is scheduled before it,
which the overlap of TP/SP communication relies on. (Megatron-FSDP and torch FSDP2 assert the
opposite, that it is *not* 1, for more parallel queues.) The variable is read by the CUDA
driver only: neither the NPU runtime (CANN, torch_npu) nor the host reads it, and on them the
order of collectives and compute does not depend on it.

So on npu and cpu a user gets the same run whatever the variable holds, or without it: while
``validate_args`` (and the YAML config's ``validate_yaml``) run, the variable has the value
Megatron's checks ask for — ``1`` with TP or CP, unset with FSDP — and afterwards it is put back
as the user had it (``os.environ`` of the training process, and of anything it launches, is
left unchanged).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["VARIABLE", "megatron_expects", "validate_args", "validate_yaml"]

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
_UNSET = object()


def megatron_expects(args: Any) -> Any:
    """The value Megatron-LM 0.16's checks want for ``args``: ``"1"``, None (unset) or ``_UNSET`` (no check)."""
    if getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False):
        return None  # FSDP asserts the variable is not 1 (with TP/CP it only warns)
    if (getattr(args, "tensor_model_parallel_size", 1) or 1) > 1 or (getattr(args, "context_parallel_size", 1) or 1) > 1:
        return "1"
    return _UNSET


@contextmanager
def _presented(value: Any) -> Iterator[None]:
    if value is _UNSET:
        yield
        return
    before = os.environ.get(VARIABLE)
    if value is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before


def validate_args(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``megatron.training.arguments.validate_args`` with the variable Megatron's checks ask for."""
    namespace = args[0] if args else kwargs.get("args")
    with _presented(megatron_expects(namespace)):
        return wrapped(*args, **kwargs)


def validate_yaml(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``megatron.training.yaml_arguments.validate_yaml``: its checks only ever ask for ``1``."""
    with _presented("1"):
        return wrapped(*args, **kwargs)
