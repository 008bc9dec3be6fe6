"""Which releases a migration is for: the megatron-core a process would import (``adaptors/megatron/detect.py``), and the table's rules."""

from __future__ import annotations

from collections.abc import Iterable

from .rules import FlagRule, MigrationError

__all__ = ["NEWEST_MINDSPEED_LLM", "installed_megatron", "rules"]

NEWEST_MINDSPEED_LLM = "26.1.0"  # the release a launch is read as when none is named


def installed_megatron() -> str:
    """The megatron-core release ``import megatron.core`` would give (a checkout first on the path shadows the wheel)."""
    from ..adaptors.megatron.detect import find_megatron

    found = find_megatron()
    if found is None:
        raise MigrationError("megatron-core is not importable here: name the release with --megatron-release "
                             "(e.g. 0.16.1), or install megatron-core / put a Megatron-LM checkout on PYTHONPATH")
    return found.version


def rules(extra: Iterable[FlagRule] = ()) -> list[FlagRule]:
    """Every rule, first match wins: ``extra``, then plugins' (``ascend_patch_migrate_flags``), then built-ins.

    A third-party plugin's rule for a flag comes before the built-in one, so a plugin can
    correct or extend the table; a plugin that fails is reported by the plugin manager and skipped.
    """
    from ..plugins import get_plugin_manager
    from .table import FLAGS

    found = list(extra)
    for name, contributed in get_plugin_manager().call_each("ascend_patch_migrate_flags"):
        if name == "migrate":
            continue  # the built-in table, added last below
        for rule in contributed or ():
            if not isinstance(rule, FlagRule):
                raise MigrationError(f"plugin {name!r} returned {type(rule).__name__} from ascend_patch_migrate_flags; "
                                     "expected ascend_patch.migrate.FlagRule")
            found.append(rule)
    return found + list(FLAGS)
