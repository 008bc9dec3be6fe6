"""The error a CUDA API raises when the target cannot provide it (a leaf: imports nothing of ours).

Backends, the cpu target's device module and the adaptors all raise it; keeping it
here lets each of them import it without importing the others.
"""

from __future__ import annotations
from .errors import AscendPatchError

__all__ = ["UnsupportedOnTarget", "unsupported"]


class UnsupportedOnTarget(AscendPatchError, RuntimeError):
    """A CUDA API that the target cannot provide; the message names the API and the target."""


def unsupported(api: str, why: str, target: str) -> UnsupportedOnTarget:
    """The error for ``api`` on ``target``, saying why (raise it)."""
    return UnsupportedOnTarget(f"{api} is not supported on the {target} target: {why}")
