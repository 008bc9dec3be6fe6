"""gloo's worker threads finish freeing their collectives before the interpreter finalizes (comm.teardown)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from helpers import child_env, free_port

HERE = os.path.dirname(os.path.abspath(__file__))


def test_destroy_process_group_waits_for_idle_gloo_workers(patched):
    from ascend_patch.comm import teardown
    from torch.distributed import distributed_c10d as c10d

    assert c10d.destroy_process_group.__module__ == "ascend_patch.comm.teardown"
    # gloo workers of groups earlier tests made in this process may still be around (asleep)
    before = teardown._worker_states()
    assert teardown.quiesce_gloo_workers() is True
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        summed = torch.ones(3)
        dist.all_reduce(summed)
        assert summed.tolist() == [1.0, 1.0, 1.0]
        new = set(teardown._worker_states()) - set(before)
        # this group's gloo worker threads (ProcessGroupGloo starts two; the second may not be named yet under load)
        assert 1 <= len(new) <= 2, new
        assert teardown.quiesce_gloo_workers() is True
        assert all(state == "S" for state, _ in teardown._worker_states().values())
    finally:
        dist.destroy_process_group()


def test_remove_puts_destroy_process_group_back():
    import ascend_patch
    from ascend_patch.config import Settings
    from torch.distributed import distributed_c10d as c10d

    original = c10d.destroy_process_group
    ascend_patch.apply(Settings(device="cpu"))
    try:
        assert c10d.destroy_process_group is not original
        assert dist.destroy_process_group is not original  # the package's by-value copy is re-bound
    finally:
        ascend_patch.remove()
    assert c10d.destroy_process_group is original and dist.destroy_process_group is original


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "destroy"])
def test_a_worker_holding_the_last_reference_at_exit_does_not_abort(mode):
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "ascend_patch", os.path.join(HERE, "teardown_child.py"), mode],
                              env=child_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port, ASCEND_PATCH_DEVICE="cpu"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    results = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=300)]]
    for rank, (code, out, err) in enumerate(results):
        assert "terminate called" not in err, f"rank {rank}:\n{err[-2000:]}"
        assert code == 0, f"rank {rank} exited with {code}:\n{err[-2000:]}"
    assert results[0][1].strip() == "rank 0 done: [2.0, 2.0, 2.0, 2.0]"
