"""Fixtures for the megatron-core tests: a one-process model-parallel world on the cpu target."""

from __future__ import annotations

import pytest


@pytest.fixture
def mcore_world(patched, tmp_path):
    """The cpu target applied, a gloo world of one process, megatron-core's parallel state (1x1)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    try:
        yield patched
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
