"""Which releases a migration is for: the megatron-core a process would import, and the table's rules.

The release is read from ``megatron/core/package_info.py`` of the tree found on ``sys.path``
(a Megatron-LM checkout first on the path shadows the wheel), without importing megatron.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Iterable, Sequence

from .rules import FlagRule, MigrationError

__all__ = ["NEWEST_MINDSPEED_LLM", "installed_megatron", "package_info_release", "rules"]

NEWEST_MINDSPEED_LLM = "26.1.0"  # the release a launch is read as when none is named
_FIELD = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([^'\"\s#]*)", re.M)


def package_info_release(path: str) -> str:
    """``MAJOR.MINOR.PATCH[PRE_RELEASE]`` from a megatron-core ``package_info.py``."""
    with open(path, encoding="utf-8") as f:
        fields = dict(_FIELD.findall(f.read()))
    try:
        return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"
    except KeyError:
        raise MigrationError(f"{path} does not say MAJOR/MINOR/PATCH") from None


def installed_megatron(path: Sequence[str] | None = None) -> str:
    """The megatron-core release ``import megatron.core`` would give (``path``: search this instead of sys.path)."""
    if "megatron.core.package_info" in sys.modules:
        return str(sys.modules["megatron.core.package_info"].__version__)
    roots: list[str] = list(path) if path is not None else []
    if path is None:
        spec = importlib.util.find_spec("megatron")
        roots = [os.path.dirname(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        candidate = os.path.join(root, "megatron", "core", "package_info.py")
        if os.path.isfile(candidate):
            return package_info_release(candidate)
    raise MigrationError("megatron-core is not importable here: name the release with --megatron-release "
                         "(e.g. 0.16.1), or install megatron-core / put a Megatron-LM checkout on PYTHONPATH")


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
