"""Helpers shared by test modules (import them as `from helpers import ...`)."""

from __future__ import annotations

import os
import socket

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process: no ASCEND_PATCH_* left from the test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port free on this host now (for a child's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
