"""The ``--vocab-size`` that gives Megatron's NullTokenizer a model's vocabulary, on the release that runs.

The estimate stands a NullTokenizer for a tokenizer that is not on this machine. Up to
megatron-core 0.17 it adds its end-of-document id after ``--vocab-size`` ids; Megatron-LM main's
counts it among them (release fact ``null_tokenizer_adds_eod``).
"""

from __future__ import annotations

import os

from ...adaptors.megatron.detect import read_package_info
from ...adaptors.megatron.releases import has

__all__ = ["megatron_version_at", "null_tokenizer_vocab_size"]


def megatron_version_at(root: str | None) -> str | None:
    """The megatron-core release of the Megatron-LM checkout ``root``; None when it carries no
    ``megatron/core`` (the installed megatron-core is what runs then)."""
    info = os.path.join(root, "megatron", "core", "package_info.py") if root else None
    return read_package_info(info) if info and os.path.isfile(info) else None


def null_tokenizer_vocab_size(vocab: int, version: str | None = None) -> int:
    """``--vocab-size`` for a NullTokenizer of ``vocab`` ids on ``version`` (default: the release this process
    imports)."""
    return vocab - 1 if has("null_tokenizer_adds_eod", version) else vocab
