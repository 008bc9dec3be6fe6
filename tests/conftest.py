"""Shared fixtures. Tests run on the cpu target and must leave the process as they found it."""

from __future__ import annotations

import os
import sys

# Applying on import is the product's default; tests apply and remove explicitly.
os.environ["ASCEND_PATCH"] = "0"
for _name in list(os.environ):
    if _name.startswith("ASCEND_PATCH_"):
        del os.environ[_name]

import pytest  # noqa: E402

from helpers import REPO, child_env  # noqa: E402,F401  (shared with test modules)


def pytest_addoption(parser):
    parser.addoption("--release-matrix", choices=("ci", "all"), default="ci",
                     help="Megatron releases x launch kinds (tests/megatron_lm/test_release_matrix.py): 'ci' (the "
                          "default) runs CI's subset and skips the other cells, 'all' runs every cell")


def pytest_collection_modifyitems(config, items):
    # skipped, not deselected: a selection made only of such cells still reports them (pytest never exits 5)
    if config.getoption("--release-matrix") == "all":
        return
    outside = pytest.mark.skip(reason="a Megatron release x launch kind outside CI's subset: pytest --release-matrix all")
    for item in items:
        if item.get_closest_marker("release_matrix_full"):
            item.add_marker(outside)


@pytest.fixture
def cpu_settings():
    from ascend_patch.config import Settings

    return Settings(device="cpu")


@pytest.fixture
def patched(cpu_settings):
    """The cpu target applied for one test, removed afterwards."""
    import ascend_patch

    report = ascend_patch.apply(cpu_settings)
    assert report.target == "cpu"
    try:
        yield report
    finally:
        ascend_patch.remove()


@pytest.fixture(autouse=True)
def _no_patch_leaks():
    yield
    manager = sys.modules.get("ascend_patch.patching.manager")
    if manager is not None and manager.manager.active:
        manager.manager.remove()
        pytest.fail("a test left ascend_patch applied; use the `patched` fixture")
