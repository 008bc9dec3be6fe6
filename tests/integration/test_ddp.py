"""A plain DDP script (nccl, set_device, device_ids) under torchrun on the cpu target."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, child_env, free_port

pytestmark = pytest.mark.slow


def test_ddp_gradients_equal_single_process(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import ddp_train

    dump = tmp_path / "grads.pt"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port())]
    done = subprocess.run([*torchrun, "-m", "ascend_patch", os.path.join(REPO, "examples", "ddp_train.py"),
                           "--steps", "3", "--dump-grads", str(dump)],
                          capture_output=True, text=True, env=child_env(), timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "backend nccl world 2" in done.stdout  # the name program code sees; gloo underneath
    result = torch.load(dump)
    assert result["world"] == 2

    # the same first step in one process: the mean loss over both ranks' batches
    model = ddp_train.make_model()
    xs, ys = zip(*(ddp_train.batch_for(rank, 0) for rank in range(2)))
    loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in zip(xs, ys)) / 2
    loss.backward()
    for got, param in zip(result["grads"], model.parameters()):
        torch.testing.assert_close(got, param.grad, rtol=1e-5, atol=1e-6)
