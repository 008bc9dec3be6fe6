"""Version ranges are decided exactly as packaging decides them, fast path or not (a seeded property test)."""

from __future__ import annotations

import random

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ascend_patch.patching import versions


def _release(rng: random.Random) -> str:
    parts = [str(rng.choice([0, 0, 1, 1, 2, 13, 16])) for _ in range(rng.choice([1, 2, 2, 3, 3, 4]))]
    if rng.random() < 0.05:
        parts[0] = "0" + parts[0]  # leading zeros normalise away
    return ".".join(parts)


def _version(rng: random.Random, local: bool = True) -> str:
    text = _release(rng)
    if rng.random() < 0.1:
        text = f"1!{text}"
    if rng.random() < 0.15:
        text += rng.choice(["a1", "b2", "rc1", "rc0"])
    if rng.random() < 0.15:
        text += rng.choice([".post1", ".post0", "-1"])
    if rng.random() < 0.1:
        text += ".dev0"
    if local and rng.random() < 0.35:
        text += rng.choice(["+cpu", "+cu121", "+abc.5", "+0"])
    return text


def _specifier(rng: random.Random) -> str:
    clauses = []
    for _ in range(rng.choice([0, 1, 2, 2, 3])):
        op = rng.choice(["==", "!=", "<=", ">=", "<", ">", "<", ">", "~=", "==="])
        bound = _release(rng) if rng.random() < 0.7 else _version(rng)
        if op in ("==", "!=") and rng.random() < 0.1:
            bound += ".*"
        clauses.append(op + " " * rng.choice([0, 0, 1]) + bound)
    return rng.choice([",", ", ", " ,"]).join(clauses)


def _packaging(installed: str, spec: str) -> bool | str:
    try:
        return SpecifierSet(spec).contains(installed)
    except InvalidSpecifier as exc:
        return type(exc).__name__


def _ours(installed: str, spec: str) -> bool | str:
    try:
        return versions.in_range(installed, spec)
    except InvalidSpecifier as exc:
        return type(exc).__name__


def test_in_range_agrees_with_packaging_on_random_versions_and_ranges():
    rng = random.Random(20261203)
    plain = 0
    for _ in range(6000):
        installed, spec = _version(rng), _specifier(rng)
        assert _ours(installed, spec) == _packaging(installed, spec), (installed, spec)
        plain += versions._plain_in_range(installed, spec) is not None
    assert plain > 1500  # the fast path decided a good share of the cases itself


@pytest.mark.parametrize("installed, spec, expected", [
    ("2.13.0+cpu", "==2.13.0", True),  # a local label matches its public version...
    ("2.13.0+cpu", ">2.13.0", False),  # ...and never makes an exclusive comparison true
    ("2.13.0+cpu", "<=2.13", True),
    ("2.13.0+cpu", "<2.13.0", False),
    ("0.16.1", ">=0.16,<0.17", True),
    ("0.17.0", ">=0.16,<0.17", False),
])
def test_the_fast_path_decides_the_plain_ranges_as_packaging_does(installed, spec, expected):
    assert versions._plain_in_range(installed, spec) is expected
    assert SpecifierSet(spec).contains(installed) is expected


def test_what_the_fast_path_leaves_to_packaging():
    for installed, spec in [("0.17.0rc1", ">=0.16,<0.17"), ("1.0.post1", ">1.0"), ("1!1.0", ">=1"),
                            ("1.4", "~=1.0"), ("0.16.1", "==0.16.*"), ("1.0", ">=1.0rc1"), ("1.0", "===1.0")]:
        assert versions._plain_in_range(installed, spec) is None, (installed, spec)
