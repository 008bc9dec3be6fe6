"""Pipeline sends that outlive Megatron's pseudo-deallocation, on gloo (the cpu target).

With the interleaved (virtual pipeline) schedule, megatron-core overlaps pipeline
communication with compute: ``_p2p_ops`` issues ``isend``/``irecv`` and the schedule waits on
them later. Right after issuing the send of a stage's output, the schedule calls
``deallocate_output_tensor``, which swaps the output's ``.data`` for a one-element tensor to
free activation memory (``--deallocate-pipeline-outputs``, always on in Megatron-LM).

On NCCL (and HCCL) that is safe: the process group records the tensor's storage on its
communication stream, so the caching allocator does not reuse it before the send is done.
Gloo sends from a background thread and holds the *tensor*, whose storage the swap has just
replaced: the old storage is freed and reused while gloo still reads it, and the next stage
receives garbage — NaN at the first iteration with enough microbatches in flight (PP2 x VPP2
with 8 microbatches on 2 processes), deterministically.

The patch hands ``isend`` a detached alias of each outgoing tensor: same storage, no copy, but
a tensor object of its own, which the swap does not touch, so the storage lives until gloo's
send is finished. cpu target only; on npu, HCCL keeps the storage alive as NCCL does.
"""

from __future__ import annotations

from typing import Any

from ...patch import Action, Patch, Wrap
from .releases import needed_on

__all__ = ["p2p_patches", "sends_keep_their_storage"]

_SENDS = ("tensor_send_next", "tensor_send_prev")


def sends_keep_their_storage(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_p2p_ops(**kwargs)`` with each outgoing tensor replaced by a detached alias of its storage."""
    for name in _SENDS:
        tensor = kwargs.get(name)
        if tensor is not None:
            kwargs[name] = tensor.detach()
    return wrapped(*args, **kwargs)


def p2p_patches() -> list[Patch]:
    return [Wrap(
        "megatron.core.pipeline_parallel.p2p_communication:_p2p_ops",
        "overlapped pipeline sends (interleaved schedule): gloo reads the sent storage from a background thread "
        "after megatron's deallocate_output_tensor has freed it; send a detached alias that keeps it alive",
        wrapper=sends_keep_their_storage, backends=frozenset({"cpu"}), **needed_on(), 
        action=Action.EMULATED, api="p2p_communication._p2p_ops", count_calls=False)]
