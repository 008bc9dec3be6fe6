"""The package's error base and the one shape of a finding.

Every error ascend_patch raises on purpose derives from :class:`AscendPatchError`, so a
command catches the base and prints the message (it says what is wrong, with the
numbers, and what to do); anything else is a bug and keeps its traceback. Most also
derive from the builtin they refine (``ValueError``, ``LookupError``) so code written
against the builtin keeps working.

A :class:`Finding` is one thing a check found: a stable ``code`` (for tests and
scripts), what is wrong, and what to do. Checks that report everything at once (the
converter's preflight, ``ascend-patch check``, the parallel-size rules) return lists of
findings; a check that stops at the first raises an error carrying one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AscendPatchError", "ConfigMismatch", "Finding", "FindingError", "UnsupportedSetting"]


class AscendPatchError(Exception):
    """Base of the errors ascend_patch raises on purpose (the message says what to do)."""


@dataclass(frozen=True)
class Finding:
    """One finding: ``code`` names the rule, ``message`` what is wrong, ``remedy`` what to do."""

    code: str
    message: str
    remedy: str = ""

    def __str__(self) -> str:
        if not self.remedy:
            return self.message
        # a message that is a whole sentence is followed by the remedy as the next one
        return f"{self.message} {self.remedy}" if self.message.endswith(".") else f"{self.message}; {self.remedy}"


class FindingError(AscendPatchError, ValueError):
    """An error that is one finding: ``str()`` is the finding's text, ``code`` and ``finding`` its parts."""

    def __init__(self, message: str, code: str = "", remedy: str = "") -> None:
        self.finding = Finding(code, message, remedy)
        super().__init__(str(self.finding))

    @property
    def code(self) -> str:
        return self.finding.code


class UnsupportedSetting(AscendPatchError, ValueError):
    """A setting (a flag, a config field) the target cannot run; the message names it and what to use."""


class ConfigMismatch(FindingError):
    """A model config lacks a field the family needs, or asks for what the model cannot do (``remedy``: what to do)."""
