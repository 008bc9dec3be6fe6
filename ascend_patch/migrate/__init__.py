"""MindSpeed-LLM launches on stock Megatron-LM: the flag table, the script reader, the translator.

* :mod:`.rules` — :class:`FlagRule` (one table entry, with the megatron-core and MindSpeed-LLM
  release ranges it is true for), :class:`Action`, :class:`Outcome`;
* :mod:`.table` — the built-in table (data), :mod:`.compute` — the rules that depend on other flags;
* :mod:`.script` — a launch script read as bash would; :mod:`.translate` — the translator;
* :mod:`.report` — the runnable script, JSON and the docs table; :mod:`.cli` — ``ascend-patch migrate``;
* :mod:`.plugin` — the same translation inside Megatron-LM's argument parsing (built-in plugin ``migrate``).

Third-party rules come from the ``ascend_patch_migrate_flags`` hook. This package imports nothing
heavy: the plugin module is loaded with every ``import ascend_patch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .script import Launch
    from .translate import Migration, StockParser

__all__ = ["Action", "FlagRule", "Given", "MigrationRefused", "Outcome", "migrate_launch", "translate_argv"]


def translate_argv(argv: list[str] | tuple[str, ...], megatron: str | None = None, mindspeed_llm: str | None = None, *,
                   script: str | None = None, env: dict[str, str] | None = None,
                   stock: StockParser | None = None) -> Migration:
    """Translate training arguments for megatron-core ``megatron`` (default: the importable release)."""
    from .releases import NEWEST_MINDSPEED_LLM, installed_megatron, rules
    from .translate import translate

    return translate(argv, megatron or installed_megatron(), mindspeed_llm or NEWEST_MINDSPEED_LLM, rules(),
                     script=script, env=env, stock=stock)


def migrate_launch(launch: Launch, megatron: str | None = None, mindspeed_llm: str | None = None) -> Migration:
    """Translate a whole launch (its script, arguments and exported variables)."""
    import os

    return translate_argv(launch.args, megatron, mindspeed_llm, script=os.path.basename(launch.script),
                          env=dict(launch.env))


def __getattr__(name: str) -> Any:  # the record types, without importing them with the package
    if name in ("Action", "FlagRule", "Given", "MigrationRefused", "Outcome"):
        from . import rules

        return getattr(rules, name)
    raise AttributeError(name)
