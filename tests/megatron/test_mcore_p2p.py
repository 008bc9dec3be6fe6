"""Overlapped pipeline sends survive Megatron's pseudo-deallocation on gloo (the VPP NaN of issue 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ascend_patch.adaptors.megatron.p2p import p2p_patches
from ascend_patch.adaptors.megatron.plugin import megatron_patches
from ascend_patch.backend import cpu_backend

from helpers import child_env

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "p2p_child.py")


def _wrong_sends() -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", CHILD]
    done = subprocess.run(cmd, env=child_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[0][len("RESULT"):])


@pytest.mark.slow
def test_sent_activations_arrive_intact_after_deallocation():
    result = _wrong_sends()
    # plain gloo reads the swapped-out storage after it was reused (39-40 of 40 here: the receiver posts late, see the child)
    assert result["stock"] > 0, result
    assert result["patched"] == 0, result


def test_the_alias_patch_is_cpu_only():
    (patch,) = p2p_patches()
    assert patch.backends == frozenset({"cpu"})  # HCCL keeps the storage alive, as NCCL does
    assert patch.target in {p.target for p in megatron_patches(cpu_backend())}


def test_the_wrapper_sends_an_alias_of_the_same_storage():
    import torch

    from ascend_patch.adaptors.megatron.p2p import sends_keep_their_storage

    out = torch.arange(6.0)
    seen = {}
    sends_keep_their_storage(lambda **kw: seen.update(kw), None, (),
                             {"tensor_send_next": out, "tensor_send_prev": None, "tensor_recv_prev": None})
    sent = seen["tensor_send_next"]
    assert sent is not out and sent.data_ptr() == out.data_ptr() and seen["tensor_send_prev"] is None
    out.data = torch.empty(1)  # megatron's deallocate_output_tensor
    assert torch.equal(sent, torch.arange(6.0))  # the alias still holds the sent values
