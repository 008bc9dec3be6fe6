"""Dropout's random stream on the cpu target is not moved by the host building data iterators.

On a GPU, dropout draws from the CUDA generators, which Megatron seeds identically on every
tensor-parallel rank (so the dropout masks of replicated activations agree across TP ranks)
and saves and restores in every checkpoint. The host generator is a separate stream that
training never reads.

On the cpu target the emulated CUDA generator *is* the host generator (host dropout draws from
it). Megatron-LM's ``build_train_valid_test_data_iterators`` makes one host draw per
``iter(DataLoader)`` (PyTorch's base seed for its workers), and only on the ranks that hold
data — TP rank 0 of each pipeline's first and last stages. That single draw:

* made the TP ranks' dropout streams differ, so the masks of replicated activations
  (hidden dropout) differed between TP ranks, and so did the gradients of replicated
  parameters (norms, row-parallel biases): TP ranks drifted apart. A torch_dist checkpoint
  keeps one replica of those parameters, so a resumed run differed from the uninterrupted one;
* moved the stream between restoring a checkpoint and the first resumed iteration (the
  iterators are built after loading), so a resumed run differed with either format.

Here the host generator's state is put back after the data iterators are built: the seed draw
still happens (workers get their seeds), and dropout's stream is where Megatron seeded or
restored it, on every rank, as on a GPU. Megatron's samplers do not use the host generator, so
the data is unchanged. On npu the NPU generator is separate from the host's, as on a GPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["keep_device_stream"]


def keep_device_stream(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``build_train_valid_test_data_iterators`` and put the host generator's state back."""
    import torch

    state = torch.get_rng_state()
    try:
        return wrapped(*args, **kwargs)
    finally:
        torch.set_rng_state(state)
