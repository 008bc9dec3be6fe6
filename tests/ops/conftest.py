"""Fixtures for the ops tests: a cpu backend whose kernel table tests can fill with reference kernels."""

from __future__ import annotations

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(**extra: str) -> dict[str, str]:
    """The root conftest's child_env (this conftest shadows its module name inside tests/ops)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture
def cpu_backend():
    from ascend_patch.backend import cpu_backend

    return cpu_backend("tests")


@pytest.fixture
def seeded():
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    yield
    torch.random.set_rng_state(state)
