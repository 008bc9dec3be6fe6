"""Vocabulary padding as Megatron does it."""

from __future__ import annotations

__all__ = ["padded_vocab_size"]


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
    """The vocabulary rounded up to a multiple of ``divisible_by * tensor_parallel_size``."""
    if vocab_size < 1 or divisible_by < 1 or tensor_parallel_size < 1:
        raise ValueError(f"vocab_size {vocab_size}, divisor {divisible_by} and TP {tensor_parallel_size} "
                         "must all be positive")
    multiple = divisible_by * tensor_parallel_size
    return -(-vocab_size // multiple) * multiple
