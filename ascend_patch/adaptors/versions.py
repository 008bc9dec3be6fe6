"""Package version checks for patches that name a package and a version range.

A patch's ``versions`` is a PEP 440 specifier; the installed version of its ``package``
is read once per ``apply()`` (reading METADATA costs milliseconds, and dozens of
patches name the same package).
"""

from __future__ import annotations

import importlib.metadata
import operator

from ..patch import Patch

__all__ = ["clear_version_cache", "version_problem"]


def clear_version_cache() -> None:
    """Forget installed versions (packages may have been installed or upgraded since)."""
    _VERSIONS.clear()


# Distribution -> installed version (None: not installed), read once per apply(): reading
# a METADATA file costs milliseconds, and dozens of patches name the same package.
_VERSIONS: dict[str, str | None] = {}


def _installed_version(package: str) -> str | None:
    if package not in _VERSIONS:
        try:
            _VERSIONS[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            _VERSIONS[package] = None
    return _VERSIONS[package]


def version_problem(patch: Patch) -> str | None:
    """Why ``patch`` must be skipped on the installed version of its package, or None."""
    if patch.package is None:
        return None
    installed = _installed_version(patch.package)
    if installed is None:
        return f"{patch.package} is not installed (patch checked against {patch.versions})"
    if not _in_range(installed, patch.versions or ""):
        return f"{patch.package} {installed} is outside the checked range {patch.versions}"
    return None


_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
            "==": operator.eq, "!=": operator.ne}


def _in_range(installed: str, versions: str) -> bool:
    """``installed`` satisfies ``versions``, with packaging's semantics.

    Ranges written as plain comparisons (">=0.16,<0.17", what every built-in patch uses)
    are decided with packaging.version alone; anything else (wildcards, ~=, pre-releases)
    goes to packaging.specifiers, whose import costs ~20 ms of every `import ascend_patch`.
    """
    from packaging.version import InvalidVersion, Version

    try:
        have = Version(installed)
        clauses = []
        for clause in filter(None, (c.strip() for c in versions.split(","))):
            op = clause[:2] if clause[:2] in _COMPARE else clause[:1]
            bound = clause[len(op):].strip()
            if op not in _COMPARE or "*" in bound:
                raise ValueError(clause)
            clauses.append((_COMPARE[op], Version(bound)))
    except (InvalidVersion, ValueError):
        clauses = None
    if clauses is not None and not have.is_prerelease:
        return all(compare(have, bound) for compare, bound in clauses)
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(versions).contains(installed)
