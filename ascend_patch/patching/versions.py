"""Package version checks for patches that name a package and a version range (PEP 440)."""

from __future__ import annotations

import importlib.metadata
import operator
import re

from ..hookspec import PackageVersion
from ..patch import Patch

__all__ = ["clear_version_cache", "in_range", "package_version", "version_problem", "versions_seen"]


def clear_version_cache() -> None:
    """Forget package versions (packages may have been installed or upgraded since)."""
    _VERSIONS.clear()


# Distribution -> its version (None: not installed), read once per apply(): reading a METADATA
# file costs milliseconds, and dozens of patches name the same package.
_VERSIONS: dict[str, PackageVersion | None] = {}


def package_version(package: str) -> PackageVersion | None:
    """The version of ``package`` the process uses: a plugin's answer (``ascend_patch_package_version``,
    e.g. megatron-core read from the tree a checkout puts first on ``sys.path``), else the installed
    distribution's metadata; None when neither knows it."""
    if package not in _VERSIONS:
        from ..plugins import get_plugin_manager

        found = None
        for _, answer in get_plugin_manager().call_each("ascend_patch_package_version", package=package):
            if answer is not None:
                found = answer
                break
        if found is None:
            try:
                found = PackageVersion(importlib.metadata.version(package), "installed distribution")
            except importlib.metadata.PackageNotFoundError:
                found = None
        _VERSIONS[package] = found
    return _VERSIONS[package]


def versions_seen() -> dict[str, PackageVersion]:
    """Every package version this apply's patches were checked against, by package."""
    return {name: found for name, found in _VERSIONS.items() if found is not None}


def version_problem(patch: Patch) -> tuple[str, bool] | None:
    """(why, whether strict mode makes it fatal) when ``patch`` must be skipped on its package's version.

    Outside ``versions`` (the range it was checked against) is a problem; outside ``needed``
    (the releases that need it) is a plain "not needed".
    """
    if patch.package is None:
        return None
    found = package_version(patch.package)
    ranges = patch.versions or patch.needed
    if found is None:
        return f"{patch.package} is not installed (patch for {ranges})", True
    if patch.versions and not in_range(found.version, patch.versions):
        return f"{patch.package} {found.version} is outside the checked range {patch.versions}", True
    if patch.needed and not in_range(found.version, patch.needed):
        return f"not needed on {patch.package} {found.version} (needed on {patch.needed})", False
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
