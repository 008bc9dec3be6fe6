"""The shape of the migration table: one :class:`FlagRule` per MindSpeed-LLM flag and release range.

A rule says what stock Megatron-LM does with one flag (or environment variable) of a
MindSpeed-LLM launch: :class:`Action`, the stock arguments it becomes (``to``, with ``{value}``
standing for the value given), and why. ``megatron`` and ``mindspeed_llm`` are PEP 440 ranges
of the releases the rule is true for (megatron-core's by a named fact of :mod:`.facts`, where every
range is written once), so a new release is an edit of a range or one more entry. A rule whose result depends on other
flags names a function (``compute``) that returns an :class:`Outcome`.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import AscendPatchError
from .facts import in_range, megatron_has

__all__ = ["MINDSPEED_LLM", "Action", "Context", "FlagRule", "Given", "MigrationError", "MigrationRefused",
           "Outcome"]

# The MindSpeed-LLM releases the built-in table was read from (their flag definitions and example
# scripts); all of them pin Megatron-LM core_v0.12.1.
MINDSPEED_LLM = ">=2.3.0,<=26.1.0"


class MigrationError(AscendPatchError, ValueError):
    """A launch script or command line the migration cannot read (the message says which part)."""


class MigrationRefused(AscendPatchError):
    """A flag whose meaning stock Megatron-LM cannot reproduce: stop before training.

    ``rows`` holds the refused rows of the report; the message names each flag, why, and what to do.
    """

    def __init__(self, message: str, rows: tuple = ()) -> None:
        super().__init__(message)
        self.rows = rows


class Action(str, enum.Enum):
    """What happens to one flag of the original launch."""

    KEPT = "kept"  # stock has the flag with the same meaning
    TRANSLATED = "translated"  # stock spells it differently (``to``)
    IMPLIED = "implied"  # what the flag asks for, ascend_patch already does (no stock flag needed)
    EXPLICIT = "made explicit"  # absent, and stock's default differs from MindSpeed-LLM's: added
    DROPPED = "dropped"  # no stock equivalent; results unchanged (the cost is stated)
    REFUSED = "refused"  # no stock equivalent and dropping it would change results


@dataclass(frozen=True)
class Given:
    """One flag (or exported variable) as the launch gives it: ``--spec a b`` is ("--spec", ("a", "b"))."""

    flag: str
    values: tuple[str, ...] = ()

    @property
    def value(self) -> str | None:
        return " ".join(self.values) if self.values else None

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.flag, *self.values)


@dataclass(frozen=True)
class Context:
    """The whole launch a rule is judged in: every flag given, and the target releases."""

    given: tuple[Given, ...]
    megatron: str  # the megatron-core release the launch is for, e.g. "0.16.1"
    mindspeed_llm: str  # the MindSpeed-LLM release the script was written for
    env: Mapping[str, str] = field(default_factory=dict)

    def find(self, flag: str) -> Given | None:
        """The last occurrence of ``flag`` (argparse keeps the last one)."""
        found = [g for g in self.given if g.flag == flag]
        return found[-1] if found else None

    def has(self, flag: str) -> bool:
        return self.find(flag) is not None

    def value(self, flag: str, default: str | None = None) -> str | None:
        given = self.find(flag)
        return given.value if given is not None and given.value is not None else default

    def number(self, flag: str, default: int) -> int:
        """``flag``'s integer value, or ``default`` when absent (a malformed value raises MigrationError)."""
        text = self.value(flag)
        if text is None:
            return default
        try:
            return int(text)
        except ValueError:
            raise MigrationError(f"{flag} {text}: expected an integer") from None


@dataclass(frozen=True)
class Outcome:
    """What a rule makes of one flag in one launch.

    ``replaces`` maps other flags of the launch to why this translation takes their place (their
    rows become ``translated`` into this one and their arguments leave the command); ``before``
    are shell commands the launch needs first; ``env`` variables the launch needs set.
    """

    action: Action
    to: tuple[str, ...] = ()
    why: str = ""
    replaces: Mapping[str, str] = field(default_factory=dict)
    before: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


Compute = Callable[["Given | None", Context], "Outcome | None"]


@dataclass(frozen=True)
class FlagRule:
    """One entry of the migration table.

    ``flag``: ``--name``, or an environment variable (``HCCL_*`` patterns allowed). ``values``:
    the rule applies only to these values (``*`` patterns allowed; empty: any). ``megatron``: the
    megatron-core releases it is true for, as a fact of :mod:`.facts` (``"!fact"``: the releases
    without it; a plugin may give a PEP 440 range); ``mindspeed_llm``: a PEP 440 range of
    MindSpeed-LLM releases ("" = every release). ``absent``: the rule is for a
    launch that does *not* give the flag (a default that differs, made explicit); its
    ``compute`` may return None when it does not apply. ``to`` may use ``{value}``.
    """

    flag: str
    action: Action
    why: str
    to: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    megatron: str = ""
    mindspeed_llm: str = MINDSPEED_LLM
    absent: bool = False
    compute: Compute | None = None

    def matches(self, given: Given | None, megatron: str, mindspeed_llm: str) -> bool:
        """Whether the rule is the one for ``given`` (None: the flag is absent) at these releases."""
        if given is None:
            if not self.absent:
                return False
        elif self.absent or not fnmatch.fnmatchcase(given.flag, self.flag) or self.values and not any(
                fnmatch.fnmatchcase(given.value or "", v) for v in self.values):
            return False
        return megatron_has(megatron, self.megatron) and in_range(mindspeed_llm, self.mindspeed_llm)

    def outcome(self, given: Given | None, context: Context) -> Outcome | None:
        """The rule's :class:`Outcome` for ``given`` in ``context`` (None: it does not apply)."""
        if self.compute is not None:
            return self.compute(given, context)
        value = given.value if given is not None else None
        to = tuple(part.format(value=value or "") for part in self.to)
        return Outcome(self.action, to, self.why)
