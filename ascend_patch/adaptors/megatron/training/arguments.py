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

``--batch-invariant-mode`` is refused there, before anything is built, while triton is not
installed: it replaces torch's ``mm``/``addmm``/``log_softmax``/``mean`` with triton kernels (and
imports Transformer Engine to patch its GEMMs), which nothing on the npu/cpu target can run;
megatron would otherwise fail on ``import transformer_engine`` or at the first matmul.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["VARIABLE", "megatron_expects", "refuse_unsupported", "validate_args", "validate_yaml"]

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
_UNSET = object()


def megatron_expects(args: Any) -> Any:
    """The value Megatron-LM's checks want for ``args``: ``"1"``, None (unset) or ``_UNSET`` (no check).

    Read from the arguments, so every release's rule is met: FSDP (torch FSDP2, 0.12-0.13's custom
    FSDP, 0.14+'s Megatron-FSDP) asserts the variable is not 1; otherwise every release asserts 1 with
    TP or CP, and core_r0.8.0 also whenever its (deprecated, default-on) async TP all-reduce or sequence
    parallelism is on.
    """
    if any(getattr(args, flag, False) for flag in ("use_torch_fsdp2", "use_custom_fsdp", "use_megatron_fsdp")):
        return None  # FSDP asserts the variable is not 1 (with TP/CP it only warns)
    if ((getattr(args, "tensor_model_parallel_size", 1) or 1) > 1 or (getattr(args, "context_parallel_size", 1) or 1) > 1
            or getattr(args, "async_tensor_model_parallel_allreduce", False) or getattr(args, "sequence_parallel", False)):
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


def _triton_installed() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and "ascend_patch shim" not in str(spec.origin)


def refuse_unsupported(args: Any) -> None:
    """Raise for flags the target cannot run, naming the flag and what to do."""
    if getattr(args, "batch_invariant_mode", False) and not _triton_installed():
        from ..triton_shim import TritonUnavailable

        raise TritonUnavailable(
            "--batch-invariant-mode replaces torch's matmul, log_softmax and mean with triton kernels (and patches "
            "Transformer Engine's GEMMs), and triton is not installed: the npu/cpu target has no backend to run them. "
            "Remove --batch-invariant-mode.")


def validate_args(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``megatron.training.arguments.validate_args`` with the variable Megatron's checks ask for."""
    namespace = args[0] if args else kwargs.get("args")
    refuse_unsupported(namespace)
    with _presented(megatron_expects(namespace)):
        return wrapped(*args, **kwargs)


def validate_yaml(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``megatron.training.yaml_arguments.validate_yaml``: its checks only ever ask for ``1``."""
    with _presented("1"):
        return wrapped(*args, **kwargs)
