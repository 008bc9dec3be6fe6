"""Megatron-LM's setup draws leave the cpu target's host generator where they found it.

On a GPU, the host generator and the CUDA generators are separate streams. Megatron seeds
both; the host one initialises what is built on the host (learned position embeddings,
``--use-cpu-initialization`` weights), the CUDA ones drive dropout (identical on every
tensor-parallel rank, so the masks of replicated activations agree) and are saved and restored
in every checkpoint. Setup code that draws random tensors on the GPU therefore never moves the
host stream, and the other way round.

On the cpu target the emulated CUDA generator *is* the host generator, so every draw Megatron-LM
makes while setting up moves both. Two of them changed results:

* ``megatron.training.initialize._warmup_jit_function`` (called by ``set_jit_fusion_options``
  between seeding and building the model) draws ``torch.rand`` tensors sized by the TP and CP
  sizes, and a dropout mask, "on cuda". The model built after it started from host-generator
  weights that depended on the parallel layout: a learned-position model at CP2 (or TP2 with
  ``--use-cpu-initialization``) did not start from CP1's weights.
* ``megatron.training.training.build_train_valid_test_data_iterators`` makes one host draw per
  ``iter(DataLoader)`` (PyTorch's base seed for its workers), and only on the ranks that hold
  data (TP rank 0 of the first and last pipeline stages). The TP ranks' dropout streams
  differed, so the gradients of replicated parameters did and TP ranks drifted apart; and the
  draw came after a checkpoint's RNG state was restored, so resumed runs were not exact.

One wrapper serves every such call (:data:`HOST_DRAWS`): it runs the call and puts the host
generator's state back. The draws still happen (the JIT functions are warmed up, DataLoader
workers get their seeds); what follows starts from the stream Megatron seeded or restored, on
every rank and at every layout, as on a GPU. Neither call's result depends on the stream
(warm-up outputs are discarded; Megatron's samplers do not use the host generator). On npu the
NPU generator is separate from the host's, as on a GPU, and these patches do not apply.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HOST_DRAWS", "keep_host_generator"]

# target -> why its draws must not move the stream (the plugin makes one cpu-only Wrap of each)
HOST_DRAWS: dict[str, str] = {
    "megatron.training.initialize:_warmup_jit_function":
        "Megatron-LM's JIT warm-up draws tensors sized by TP/CP from the emulated CUDA generator, which is the "
        "host generator on cpu: it leaves the host stream as seeded, so host-initialised weights (learned "
        "positions, --use-cpu-initialization) do not depend on the parallel layout",
    "megatron.training.training:build_train_valid_test_data_iterators":
        "the host generator is dropout's generator on cpu: building data iterators (a seed draw per DataLoader, "
        "on the ranks holding data only) leaves it as Megatron seeded or restored it, so TP ranks agree and "
        "resumed runs are exact",
}


def keep_host_generator(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the wrapped call and put the host generator's state back (also when it raises)."""
    import torch

    state = torch.get_rng_state()
    try:
        return wrapped(*args, **kwargs)
    finally:
        torch.set_rng_state(state)
