"""The translation inside Megatron-LM: ``megatron.training.arguments.parse_args`` reading MindSpeed-LLM flags.

A command line stock's parser accepts is left alone. One it would reject (a flag it does not
define, a value outside its choices) or that names a MindSpeed-LLM-only value (``--spec
mindspeed_llm...``) is translated with the table for the megatron-core release this process
imported: rank 0 prints each translation once, each is noted in ascend_patch's report, and a
refused flag stops the run before anything is built, with the message ``ascend-patch migrate``
prints. ``sys.argv`` is the translated one while Megatron parses, and the user's afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .rules import Action, MigrationRefused
from .translate import Migration, StockParser, parse_flags

__all__ = ["announce", "parse_args", "stock_parser"]

_announced: set[tuple[str, ...]] = set()


def stock_parser(extra_args_provider: Any = None) -> StockParser:
    """What Megatron-LM's own parser (and the entry point's extra arguments) accepts in this process."""
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    options, choices = set(), {}
    for action in parser._actions:
        options.update(action.option_strings)
        if action.choices:
            for name in action.option_strings:
                choices[name] = frozenset(str(c) for c in action.choices)
    return StockParser(frozenset(options), choices)


def _engaged(argv: list[str], stock: StockParser, rules: list, megatron: str, mindspeed_llm: str) -> bool:
    """Whether stock would reject the command line, or it names a value only MindSpeed-LLM knows."""
    try:
        given = parse_flags(argv)
    except Exception:
        return False  # not a Megatron-LM command line: stock's parser says what is wrong
    return any(stock.rejects(item) or any(
        rule.values and rule.action is not Action.KEPT and rule.matches(item, megatron, mindspeed_llm)
        for rule in rules) for item in given)


def announce(migration: Migration) -> None:
    """Print the translation once per process on rank 0, and note each row in ascend_patch's report."""
    from ..usage import note

    changed = [r for r in migration.rows if r.action is not Action.KEPT]
    for row in changed:
        note(f"MindSpeed-LLM {row.flag}", row.action.value)
    key = tuple(f"{r.flag}={r.value}" for r in changed)
    if key in _announced or os.environ.get("RANK", "0") != "0":
        return
    _announced.add(key)
    lines = [f"ascend_patch migrate: MindSpeed-LLM flags for stock Megatron-LM (megatron-core {migration.megatron}):"]
    for row in changed:
        to = f" -> {' '.join(row.to)}" if row.to else ""
        lines.append(f"  {row.flag}{' ' + row.value if row.value else ''}: {row.action.value}{to} ({row.why})")
    print("\n".join(lines), flush=True)


def parse_args(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``megatron.training.arguments.parse_args`` with a MindSpeed-LLM command line translated first."""
    from .releases import NEWEST_MINDSPEED_LLM, installed_megatron, rules
    from .translate import translate

    extra = args[0] if args else kwargs.get("extra_args_provider")
    argv = sys.argv[1:]
    stock = stock_parser(extra)
    table, release = rules(), installed_megatron()
    if not _engaged(argv, stock, table, release, NEWEST_MINDSPEED_LLM):
        return wrapped(*args, **kwargs)
    migration = translate(argv, release, NEWEST_MINDSPEED_LLM, table, script=os.path.basename(sys.argv[0]), stock=stock)
    announce(migration)
    migration.raise_if_refused()
    if migration.before:
        raise MigrationRefused("ascend_patch migrate: this launch needs a step before it (MindSpeed-LLM did it at "
                               "start):\n  " + "\n  ".join(migration.before) + "\nrun it, then launch again")
    for name, value in migration.env.items():  # what a translation needs set (NCCL_ALGO for --deterministic-mode)
        os.environ.setdefault(name, value)
    saved = sys.argv
    sys.argv = [saved[0], *migration.args]
    try:
        return wrapped(*args, **kwargs)
    finally:
        sys.argv = saved
