"""Where each patch stands, what the appliers work with, and what ``ASCEND_PATCH_STRICT=1``
makes of a patch that cannot apply."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..environ import EnvTransaction
from ..patch import Patch
from ..usage import UsageRecorder
from ..errors import AscendPatchError

__all__ = ["ApplyContext", "PatchError", "PatchStatus", "skip"]


class PatchError(AscendPatchError, RuntimeError):
    """A patch could not be applied and ``ASCEND_PATCH_STRICT=1`` makes that fatal."""


@dataclass
class PatchStatus:
    """Where one patch stands: applied, deferred (waiting for an import), skipped, failed or removed."""

    patch: Patch
    state: str
    detail: str = ""
    rebound: list[str] = field(default_factory=list)


class ApplyContext:
    """What every applier is given: strictness, the usage recorder (None: reporting off), the
    environment transaction (shared with backend selection; the manager restores it)."""

    __slots__ = ("env", "recorder", "strict")

    def __init__(self, strict: bool, recorder: UsageRecorder | None, env: EnvTransaction) -> None:
        self.strict = strict
        self.recorder = recorder
        self.env = env


def skip(status: PatchStatus, why: str, strict: bool, state: str = "skipped") -> None:
    """Record that ``status``'s patch did not apply, and why; fatal when ``strict``."""
    status.state, status.detail = state, why
    if strict:
        raise PatchError(f"{status.patch.shown_as}: {why} (ASCEND_PATCH_STRICT=1 makes this fatal)")
