"""Package version checks for patches that name a package and a version range (PEP 440)."""

from __future__ import annotations

import importlib.metadata
import operator
import re

from ..patch import Patch

__all__ = ["clear_version_cache", "in_range", "version_problem"]


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
    """Why ``patch`` must be skipped on the installed version of its package, or None.

    The installed version is read once per ``apply()``: reading METADATA costs milliseconds,
    and dozens of patches name the same package.
    """
    if patch.package is None:
        return None
    installed = _installed_version(patch.package)
    if installed is None:
        return f"{patch.package} is not installed (patch checked against {patch.versions})"
    if not in_range(installed, patch.versions or ""):
        return f"{patch.package} {installed} is outside the checked range {patch.versions}"
    return None


_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
            "==": operator.eq, "!=": operator.ne}
_PLAIN_BOUND = re.compile(r"\d+(?:\.\d+)*")


def in_range(installed: str, versions: str) -> bool:
    """Whether ``installed`` satisfies the PEP 440 specifier ``versions``: exactly
    ``packaging.specifiers.SpecifierSet(versions).contains(installed)``.

    The ranges every built-in patch uses (plain comparisons of release numbers, such as
    ">=0.16,<0.17", against a final release, local label allowed: "2.13.0+cpu") are
    decided with packaging.version alone: importing packaging.specifiers would add about
    10 ms to every ``import ascend_patch`` (a built-in patch checks torch's version at
    apply; benchmarks/version_check.py measures it). A seeded property test
    (tests/patching/test_versions.py) checks that both ways agree.
    """
    plain = _plain_in_range(installed, versions)
    if plain is not None:
        return plain
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(versions).contains(installed)


def _plain_in_range(installed: str, versions: str) -> bool | None:
    """The answer when every clause is ``OP N(.N)*`` and ``installed`` a final release, else None.

    There, PEP 440 reduces to comparing the public version with each bound: a local
    label matches the bound's ``==``/``<=``/``>=`` and never makes ``>`` or ``<`` true
    (``2.13.0+cpu`` is in ``==2.13.0`` and not in ``>2.13.0``); pre-, post- and
    dev-releases and epochs have rules of their own, left to packaging.
    """
    from packaging.version import InvalidVersion, Version

    try:
        have = Version(installed)
    except InvalidVersion:
        return None
    if have.epoch or have.pre is not None or have.post is not None or have.dev is not None:
        return None
    public = Version(have.public) if have.local is not None else have
    clauses = []
    for clause in versions.split(","):
        clause = clause.strip()
        if not clause:
            continue  # packaging skips empty clauses too
        op = clause[:2] if clause[:2] in _COMPARE else clause[:1]
        bound = clause[len(op):].strip()
        if op not in _COMPARE or not _PLAIN_BOUND.fullmatch(bound):
            return None
        clauses.append((_COMPARE[op], Version(bound)))
    return all(compare(public, bound) for compare, bound in clauses)
