"""The applied target is published where lower layers read it (backend.active_backend), and withdrawn by remove()."""

from __future__ import annotations

import ascend_patch
from ascend_patch.backend import active_backend
from ascend_patch.config import Settings


def test_active_backend_follows_apply_and_remove():
    assert active_backend() is None
    ascend_patch.apply(Settings(device="cpu"))
    try:
        target = active_backend()
        assert target is not None and target.name == "cpu"
        assert target is ascend_patch.active_backend()  # the very object the manager applied
    finally:
        ascend_patch.remove()
    assert active_backend() is None and ascend_patch.active_backend() is None
