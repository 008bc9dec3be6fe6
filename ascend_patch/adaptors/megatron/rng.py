"""Megatron's CUDA RNG tracker on the cpu target.

The device adaptor already points the CUDA RNG functions (``torch.cuda.get_rng_state``,
``manual_seed``, ``default_generators``) at the host's default generator, which is the
generator host dropout draws from. That is what makes ``tracker.fork()`` work: inside the
block dropout draws from the tracked (per-TP-rank) state, and on exit the tracker puts the
generator back exactly as it found it.

Megatron checks that the *CPU* generator did not move inside the block and logs
"CPU RNG state changed within GPU RNG context" when it did. On a GPU the check catches
host randomness that escapes the fork; on the cpu target the CPU generator *is* the
forked generator, so every draw inside the block is a draw from the tracked state and the
tracker restores the generator on exit: nothing escapes, and the message fires for every
dropout. The patch drops exactly that message, only while the tracker's own exit runs,
only on the cpu target (on npu the NPU generator is separate and the check keeps its
meaning). ``test_host_rng_fork_restores_the_generator_and_keeps_streams`` in
tests/megatron/test_mcore_patches.py shows the generator is restored, the per-rank streams
are reproducible, and the stock fork does log the message.
"""

from __future__ import annotations

import logging
from typing import Any

from ...patch import Action, Patch, Wrap
from .releases import needed_on

__all__ = ["HOST_RNG_MESSAGE", "rng_patches"]

HOST_RNG_MESSAGE = "CPU RNG state changed within GPU RNG context"
_LOGGER_NAME = "megatron.core.tensor_parallel.random"


class _DropHostRngMessage(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != HOST_RNG_MESSAGE


_FILTER = _DropHostRngMessage()


class _HostFork:
    """The tracker's fork context, with the host-RNG message dropped during its exit."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __enter__(self) -> Any:
        return self._inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        logger = logging.getLogger(_LOGGER_NAME)
        logger.addFilter(_FILTER)
        try:
            return self._inner.__exit__(*exc)
        finally:
            logger.removeFilter(_FILTER)


def _fork(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _HostFork:
    return _HostFork(wrapped(*args, **kwargs))


def rng_patches() -> list[Patch]:
    return [Wrap(
        "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.fork",
        "the host generator is the CUDA generator on cpu: the tracker's 'CPU RNG state changed' "
        "check fires on every dropout and means nothing there", wrapper=_fork,
        backends=frozenset({"cpu"}), **needed_on(),  action=Action.EMULATED,
        api="CudaRNGStatesTracker.fork", count_calls=False)]
