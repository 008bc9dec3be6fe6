"""Vocabulary padding as Megatron does it."""

from __future__ import annotations

from ..errors import FindingError

__all__ = ["VocabSizeError", "padded_vocab_size"]


class VocabSizeError(FindingError):
    """A vocabulary size, padding divisor or TP size that is not positive."""


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
    """The vocabulary rounded up to a multiple of ``divisible_by * tensor_parallel_size``."""
    if vocab_size < 1 or divisible_by < 1 or tensor_parallel_size < 1:
        raise VocabSizeError(f"vocab_size {vocab_size}, divisor {divisible_by} and TP {tensor_parallel_size} "
                             "must all be positive", "vocab-size",
                             "fix the size that is not (--make-vocab-size-divisible-by is 128 in Megatron by default)")
    multiple = divisible_by * tensor_parallel_size
    return -(-vocab_size // multiple) * multiple
