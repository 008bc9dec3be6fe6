"""What stock Megatron-LM releases differ in, for the migration table: named facts, each the megatron-core
releases that have it (a PEP 440 range). The table's rules name a fact (``"!fact"``: the releases without it),
so a range is written once, here.

When ``adaptors/megatron/releases.py`` (the one module of per-release Megatron facts) exists, these entries
belong in its ``FACTS`` and :func:`megatron_has` reads them from there.
"""

from __future__ import annotations

import functools

from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["MEGATRON_FACTS", "in_range", "megatron_has"]

MEGATRON_FACTS: dict[str, str] = {
    # --moe-token-dispatcher-type alltoall_seq (removed in 0.13)
    "alltoall_seq_dispatcher": "<0.13",
    # --pipeline-model-parallel-layout (layers per (virtual) stage as a string)
    "pipeline_layout_flag": ">=0.13",
    # --padded-vocab-size
    "padded_vocab_size_flag": ">=0.14",
    # --overlap-moe-expert-parallel-comm
    "moe_ep_overlap_flag": ">=0.14",
    # a switch between the fast and the slow HF tokenizer
    "hf_tokenizer_fast_switch": ">=0.16",
    # --tokenizer-hf-use-fast, off by default: pretrain_gpt.py's data-set tokenizer is the slow one
    "tokenizer_hf_use_fast_flag": ">=0.16,<0.17",
    # --tokenizer-hf-no-use-fast (fast by default)
    "tokenizer_hf_no_use_fast_flag": ">=0.17",
}


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
