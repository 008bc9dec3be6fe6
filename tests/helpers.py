"""Helpers shared by test modules (import them as `from helpers import ...`)."""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process: no ASCEND_PATCH_* left from the test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env
