"""Stock Megatron-LM's release facts (``adaptors/megatron/releases.py``'s ``FACTS``) as the migration table reads them."""

from __future__ import annotations

import functools

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..adaptors.megatron.releases import FACTS as MEGATRON_FACTS

__all__ = ["MEGATRON_FACTS", "in_range", "megatron_has"]


@functools.lru_cache(maxsize=1024)
def in_range(release: str, specifier: str) -> bool:
    """Whether ``release`` ("0.16.1", "26.1.0", "0.20.0rc0") is in the PEP 440 range (""/None: every)."""
    if not specifier:
        return True
    return SpecifierSet(specifier, prereleases=True).contains(Version(release))


def megatron_has(release: str, fact: str) -> bool:
    """Whether megatron-core ``release`` has ``fact`` (``"!fact"``: lacks it; "": every release).

    A third-party rule may give a PEP 440 range instead of a fact name.
    """
    if not fact:
        return True
    if fact.startswith("!"):
        return not megatron_has(release, fact[1:])
    return in_range(release, MEGATRON_FACTS.get(fact, fact))
