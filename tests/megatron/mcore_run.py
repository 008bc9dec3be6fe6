"""Helpers for the megatron-core tests: the one-process ``mcore_world`` fixture, and running
examples/pretrain_gpt.py patched under torchrun.

(No conftest.py here: the test modules of other folders import the top-level ``conftest``
by name, which a second conftest.py would shadow. Test modules import the fixture.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, child_env, free_port

__all__ = ["EXAMPLE", "REPO", "child_env", "free_port", "mcore_world", "run_example"]

EXAMPLE = os.path.join(REPO, "examples", "pretrain_gpt.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")




def run_example(workdir, nproc: int, *args: str, timeout: int = 600) -> list[dict]:
    """Run the example patched under torchrun; returns its per-iteration loss records."""
    log = os.path.join(workdir, f"losses-{free_port()}.jsonl")
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "-m", "ascend_patch",
           EXAMPLE, "--loss-log", log, *args]
    env = child_env(OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-6000:]}")
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f]


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
