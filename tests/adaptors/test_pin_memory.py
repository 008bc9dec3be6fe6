"""``pin_memory=True`` in factory functions on the cpu target (torch raises without an accelerator)."""

from __future__ import annotations

import pytest
import torch


def test_factories_with_pin_memory_make_marked_host_tensors(patched):
    t = torch.tensor([3, 1], device="cpu", pin_memory=True)
    assert t.tolist() == [3, 1] and t.is_pinned()
    e = torch.empty(4, pin_memory=True)
    assert e.shape == (4,) and e.is_pinned()
    z = torch.zeros(2, 3, pin_memory=True)
    assert torch.equal(z, torch.zeros(2, 3)) and z.is_pinned()
    assert not torch.ones(2).is_pinned()
    moved = t.cuda(non_blocking=True)  # megatron's rope CP indices take this route
    assert moved.tolist() == [3, 1] and moved.device.type == "cpu"


def test_unpatched_torch_still_refuses():
    with pytest.raises(RuntimeError, match="pin_memory"):
        torch.tensor([1], pin_memory=True)
