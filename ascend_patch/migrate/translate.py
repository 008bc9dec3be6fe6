"""The translator: a MindSpeed-LLM command line -> stock Megatron-LM arguments and one report row per flag."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .rules import Action, Context, FlagRule, Given, MigrationRefused, Outcome

__all__ = ["Migration", "Row", "StockParser", "parse_flags", "translate"]

UNKNOWN = "not in the migration table: passed to stock unchanged"


@dataclass(frozen=True)
class Row:
    """One line of the report: a flag (or variable) of the original launch and what became of it."""

    flag: str
    value: str | None
    action: Action
    to: tuple[str, ...]
    why: str

    def as_json(self) -> dict:
        return {"flag": self.flag, "value": self.value, "action": self.action.value, "to": list(self.to),
                "why": self.why}


@dataclass(frozen=True)
class StockParser:
    """What stock's own parser accepts: its option strings and, per option, the values it allows (if limited)."""

    options: frozenset[str]
    choices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def rejects(self, given: Given) -> bool:
        """Whether stock's parser would refuse ``given`` (unknown flag, or a value outside its choices)."""
        if given.flag not in self.options:
            return True
        allowed = self.choices.get(given.flag)
        return bool(allowed) and any(v not in allowed for v in given.values)


@dataclass(frozen=True)
class Migration:
    """The translated launch: stock arguments, the report rows, and what the launch needs around it."""

    args: tuple[str, ...]
    rows: tuple[Row, ...]
    megatron: str
    mindspeed_llm: str
    env: Mapping[str, str] = field(default_factory=dict)  # variables the launch sets (kept + added)
    before: tuple[str, ...] = ()  # commands to run first

    @property
    def refused(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.action is Action.REFUSED)

    def refusal(self) -> str:
        """The message that stops the launch ('' when nothing is refused)."""
        if not self.refused:
            return ""
        lines = [f"ascend_patch migrate: {len(self.refused)} MindSpeed-LLM flag(s) cannot run on stock "
                 f"Megatron-LM (megatron-core {self.megatron}):"]
        lines += [f"  {r.flag}{' ' + r.value if r.value else ''}: {r.why}" for r in self.refused]
        return "\n".join(lines)

    def raise_if_refused(self) -> None:
        if self.refused:
            raise MigrationRefused(self.refusal(), self.refused)

    def counts(self) -> dict[str, int]:
        """Rows per action (flags and variables), in the order of :class:`Action`."""
        return {a.value: sum(1 for r in self.rows if r.action is a) for a in Action}


def parse_flags(argv: Sequence[str]) -> list[Given]:
    """``["--spec", "a", "b", "--bf16", "--lr=1e-4"]`` -> Given per flag; a flag takes every word up to the next ``--``.

    Words before the first flag are an error: Megatron-LM takes no positional arguments.
    """
    found: list[Given] = []
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            found.append(Given(name, (value,) if eq else ()))
        elif not found:
            from .rules import MigrationError

            raise MigrationError(f"'{word}' before the first flag: Megatron-LM takes flags only")
        else:
            last = found[-1]
            found[-1] = Given(last.flag, (*last.values, word))
    return found


def _first(rules: Iterable[FlagRule], given: Given, context: Context) -> FlagRule | None:
    return next((r for r in rules if r.matches(given, context.megatron, context.mindspeed_llm)), None)


def _row(given: Given, outcome: Outcome) -> Row:
    to = given.argv if outcome.action is Action.KEPT and not outcome.to else outcome.to
    if outcome.action in (Action.DROPPED, Action.REFUSED, Action.IMPLIED):
        to = ()
    return Row(given.flag, given.value, outcome.action, tuple(to), outcome.why)


def translate(argv: Sequence[str], megatron: str, mindspeed_llm: str, rules: Sequence[FlagRule], *,
              script: str | None = None, env: Mapping[str, str] | None = None,
              stock: StockParser | None = None) -> Migration:
    """Translate ``argv`` (the arguments after the training script) for megatron-core ``megatron``.

    ``script`` (e.g. ``pretrain_gpt.py``) and ``env`` (the launch's exported variables) get rows too.
    With ``stock`` (what stock's parser accepts), a flag neither stock nor the table knows is refused
    instead of passed on.
    """
    given = parse_flags(argv)
    context = Context(tuple(given), megatron, mindspeed_llm, dict(env or {}))
    outcomes: list[tuple[Given, Outcome]] = []
    unknown: set[str] = set()  # refused only for want of a rule: a translation that replaces them wins
    for item in given:
        rule = _first(rules, item, context)
        outcome = rule.outcome(item, context) if rule is not None else None
        if outcome is None:
            if stock is not None and item.flag not in stock.options:
                unknown.add(item.flag)
                outcome = Outcome(Action.REFUSED, why=f"stock Megatron-LM (megatron-core {megatron}) has no {item.flag} "
                                  "and the migration table has no rule for it: remove it, or add a rule through the "
                                  "ascend_patch_migrate_flags hook")
            else:
                outcome = Outcome(Action.KEPT, why=UNKNOWN)
        outcomes.append((item, outcome))

    replaced: dict[str, str] = {}
    for item, outcome in outcomes:
        for flag, why in outcome.replaces.items():
            replaced.setdefault(flag, f"{why} (see {item.flag})")
    rows = []
    for item, outcome in outcomes:
        row = _row(item, outcome)
        if item.flag in replaced and (row.action is not Action.REFUSED or item.flag in unknown):
            row = Row(item.flag, item.value, Action.TRANSLATED, (), replaced[item.flag])
        rows.append(row)

    seen = {g.flag for g in given}
    explicit = []
    for rule in rules:
        if rule.absent and rule.flag not in seen and rule.matches(None, megatron, mindspeed_llm):
            outcome = rule.outcome(None, context)
            if outcome is not None:
                seen.add(rule.flag)
                explicit.append(Row(rule.flag, None, outcome.action, tuple(outcome.to), outcome.why))
                outcomes.append((Given(rule.flag), outcome))

    args: list[str] = []
    for row in [*rows, *explicit]:
        if len(row.to) == 1 and row.to[0] in args:
            continue  # a bare switch two rows ask for
        args.extend(row.to)

    env_rows, env_out = _environment(env or {}, rules, context)
    for _, outcome in outcomes:
        env_out.update(outcome.env)
    head = []
    if script is not None:
        item = Given(script)
        rule = _first(rules, item, context)
        head = [_row(item, rule.outcome(item, context) or Outcome(Action.KEPT, why=UNKNOWN)) if rule else
                Row(script, None, Action.KEPT, (), UNKNOWN)]
    before = tuple(step for _, outcome in outcomes for step in outcome.before)
    return Migration(tuple(args), (*head, *rows, *explicit, *env_rows), megatron, mindspeed_llm, env_out, before)


def _environment(env: Mapping[str, str], rules: Sequence[FlagRule],
                 context: Context) -> tuple[list[Row], dict[str, str]]:
    rows, kept = [], {}
    for name, value in env.items():
        item = Given(name, (value,))
        rule = _first(rules, item, context)
        outcome = (rule.outcome(item, context) if rule else None) or Outcome(Action.KEPT, why=UNKNOWN)
        rows.append(Row(name, value, outcome.action, (f"{name}={value}",) if outcome.action is Action.KEPT else (),
                        outcome.why))
        if outcome.action is Action.KEPT:
            kept[name] = value
    return rows, kept
