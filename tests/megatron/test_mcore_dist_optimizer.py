"""The Megatron adaptor's DistributedOptimizer wrappers on a real megatron-core optimizer.

A child process trains a tiny GPTModel with the distributed optimizer, saves the optimizer the way
Megatron's legacy checkpoint does (``state_dict()`` + ``save_parameter_state``), and resumes into a
fresh model: steps 4 and 5 must equal the uninterrupted run exactly. Both import orders are real:
megatron-core imported after ascend_patch finds the transformer_engine shim (TE's FusedAdam, which it
prefers to apex's; step in the param groups); imported before, it builds torch's AdamW (a ``step``
tensor per parameter). Taking a wrapper off
again shows what it fixes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mcore_run import child_env

pytestmark = pytest.mark.slow

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_optim_child.py")


def resume(tmp_path, order: str, mode: str) -> dict:
    done = subprocess.run([sys.executable, CHILD, order, mode, str(tmp_path)], env=child_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("order,optimizer", [("after", "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"),
                                             ("before", "torch.optim.adamw.AdamW")])
def test_resume_with_the_distributed_optimizer_is_exact(tmp_path, order, optimizer):
    r = resume(tmp_path, order, "patched")
    assert r["optimizer"] == optimizer and r["have_apex_or_te"] is (order == "after")
    assert "error" not in r
    assert r["resumed"] == r["straight"] and r["max_param_diff"] == 0.0
    if order == "before":  # torch's Adam: every parameter has its own restored step counter
        assert r["own_step_tensors"] == r["n_params"] and r["restored_steps"] == [3.0]


def test_stock_set_states_copies_into_leaf_views_under_autograd(tmp_path):
    """Whatever the optimizer: fp32 main params are views of leaf parameters; the stock copy raises."""
    r = resume(tmp_path, "after", "no_set_states")
    assert r["error"].startswith("RuntimeError: a view of a leaf Variable that requires grad")


def test_stock_set_states_expects_a_step_the_file_does_not_have(tmp_path):
    """torch's Adam: distrib_optim.pt has no 'step'; without the restored one the load fails."""
    r = resume(tmp_path, "before", "no_grad_only")
    assert r["error"] == "KeyError: 'step'"


def test_stock_load_state_dict_shares_one_step_tensor(tmp_path):
    """torch's Adam: one shared step, incremented once per parameter, breaks the bias correction."""
    r = resume(tmp_path, "before", "no_own_steps")
    assert r["own_step_tensors"] == 1
    assert r["resumed"][0] == r["straight"][0] and r["resumed"][1] != r["straight"][1]
    assert r["max_param_diff"] > 1e-4
