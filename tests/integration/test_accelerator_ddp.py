"""A torch.accelerator-style DDP script trains on 2 processes under torchrun on the cpu target (issue 13 item 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, child_env, free_port

pytestmark = pytest.mark.slow


def test_accelerator_style_ddp_trains_as_one_process_on_the_global_batch(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import accelerator_ddp as script

    dump = tmp_path / "rank0.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), "-m", "ascend_patch",
                           os.path.join(REPO, "tests", "integration", "accelerator_ddp.py"), str(dump)],
                          capture_output=True, text=True, env=child_env(ASCEND_PATCH_DEVICE="cpu"), timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = torch.load(dump)
    assert (result["acc"], result["device"], result["backend"]) == ("cuda", "cuda:0", "nccl")  # gloo underneath

    model = script.make_model()  # one process, both ranks' batches each step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        xs, ys = zip(*(script.batch(step, rank) for rank in range(2)))
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert result["losses"] == pytest.approx(losses, rel=1e-5)
    for got, want in zip(result["params"], model.parameters()):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
