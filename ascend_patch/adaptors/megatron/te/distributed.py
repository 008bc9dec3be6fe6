"""``transformer_engine.pytorch.distributed``: the RNG tracker and recompute context megatron-core imports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ....backend import current_target

__all__ = [
    "CudaRNGStatesTracker",
    "activation_recompute_forward",
    "in_fp8_activation_recompute_phase",
    "is_fp8_activation_recompute_enabled",
]

_PHASE = {"region": False, "recompute": False}


class CudaRNGStatesTracker:
    """Named RNG states of the target's device; ``fork(name)`` runs a block on one of them.

    The current target's generator (the host's on cpu, the NPU's on npu), with TE's API (``add``,
    ``fork``, ``get_states``, ``set_states``, ``reset``). megatron-core subclasses it at import time
    (``TECudaRNGStatesTracker``) and uses it with ``--te-rng-tracker``.
    """

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def _module(self) -> Any:
        return current_target().device_module

    def reset(self) -> None:
        """Forget every state."""
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A copy of the name -> state mapping."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """Replace the states (e.g. from a checkpoint)."""
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        """A new state ``name`` seeded with ``seed``; the device generator is left as it was."""
        if seed in self.seeds_:
            raise RuntimeError(f"seed {seed} already exists")
        if name in self.states_:
            raise RuntimeError(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        module = self._module()
        original = module.get_rng_state()
        module.manual_seed(seed)
        self.states_[name] = module.get_rng_state()
        module.set_rng_state(original)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """Run the block on state ``name``; its advance is kept, the device generator restored."""
        if name not in self.states_:
            raise KeyError(f"cuda rng state {name} is not added")
        module = self._module()
        original = module.get_rng_state()
        module.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = module.get_rng_state()
            module.set_rng_state(original)


class activation_recompute_forward(contextlib.AbstractContextManager, contextlib.ContextDecorator):  # noqa: N801
    """TE's marker for the forward (``recompute_phase=False``) and recompute passes of a checkpointed block.

    megatron's output-discarding recompute opens it around forward and recompute; TE uses it to keep FP8
    scaling state consistent between the two passes. Without FP8 it only records the phase.
    """

    def __init__(self, activation_recompute: bool = False, recompute_phase: bool = False) -> None:
        super().__init__()
        self.activation_recompute = activation_recompute
        self.recompute_phase = recompute_phase

    def __enter__(self) -> activation_recompute_forward:
        _PHASE["region"] = self.activation_recompute
        _PHASE["recompute"] = self.recompute_phase
        return self

    def __exit__(self, *exc: Any) -> None:
        _PHASE["region"] = False
        _PHASE["recompute"] = False


def is_fp8_activation_recompute_enabled() -> bool:
    """In a recompute region *with FP8 on*: never, there is no FP8 here."""
    return False


def in_fp8_activation_recompute_phase() -> bool:
    """Whether the recompute pass of a checkpointed block is running."""
    return _PHASE["recompute"]
