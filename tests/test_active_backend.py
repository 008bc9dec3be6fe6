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


def test_current_target_is_the_active_backend_else_the_cpu_reference():
    from ascend_patch.backend import current_target

    reference = current_target()
    assert (reference.name, reference.kernels.names()) == ("cpu", [])  # nothing applied: pure torch
    assert current_target() is reference  # one reference object, not one per call
    ascend_patch.apply(Settings(device="cpu"))
    try:
        assert current_target() is active_backend() is not reference
    finally:
        ascend_patch.remove()
    assert current_target() is reference


def test_using_target_makes_a_backend_active_for_a_block_and_restores_the_previous_one():
    import pytest

    from ascend_patch.backend import cpu_backend, current_target, using_target

    outer, inner = cpu_backend("tests: outer"), cpu_backend("tests: inner")
    with using_target(outer) as got:
        assert got is outer and current_target() is outer and active_backend() is outer
        with pytest.raises(RuntimeError), using_target(inner):
            assert current_target() is inner
            raise RuntimeError("the previous target comes back on an error too")
        assert current_target() is outer
    assert active_backend() is None and current_target().reason.startswith("nothing is applied")
    ascend_patch.apply(Settings(device="cpu"))
    try:
        applied = active_backend()
        with using_target(outer):
            assert current_target() is outer
        assert current_target() is applied  # by identity: the manager's object
    finally:
        ascend_patch.remove()
