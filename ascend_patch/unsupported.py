"""The errors for what the target or an adaptor cannot provide; a leaf, so the backends, the cpu device
module, the adaptors and ops raise them without importing each other."""

from __future__ import annotations
from .errors import AscendPatchError

__all__ = ["UnsupportedOnTarget", "UnsupportedOption", "unsupported"]


class UnsupportedOnTarget(AscendPatchError, RuntimeError):
    """A CUDA API that the target cannot provide; the message names the API and the target."""


class UnsupportedOption(AscendPatchError, NotImplementedError):
    """An option of a stock API (flash-attn, apex, Transformer Engine) that ascend_patch's adaptor does not
    implement; the message names the option and what to do instead. Still a NotImplementedError, what code
    written against such an API (and its tests) catches."""


def unsupported(api: str, why: str, target: str) -> UnsupportedOnTarget:
    """The error for ``api`` on ``target``, saying why (raise it)."""
    return UnsupportedOnTarget(f"{api} is not supported on the {target} target: {why}")
