"""Fixtures for the ops tests: an active cpu target whose kernel table tests fill with reference kernels."""

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
def target():
    """A cpu target made the active one for the test: ops read it, tests inject reference kernels into its table."""
    from ascend_patch.backend import cpu_backend, using_target

    with using_target(cpu_backend("tests")) as active:
        yield active


@pytest.fixture
def seeded():
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    yield
    torch.random.set_rng_state(state)
