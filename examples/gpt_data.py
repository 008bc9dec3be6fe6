"""A small deterministic text corpus, a byte-level tokenizer, and Megatron-style batches.

The corpus is generated, not downloaded: sentences about small sums, orderings and
colours, drawn from a seeded generator, so every run (and every rank) sees the same
text. It has enough structure for a tiny GPT's loss to fall within a few steps. Any UTF-8
file can be used instead (``--data-path``). Tokens are bytes (vocabulary 256).
"""

from __future__ import annotations

import random

import torch

__all__ = ["VOCAB_SIZE", "generate_corpus", "load_tokens", "GPTSamples"]

VOCAB_SIZE = 256  # bytes

_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]
_COLOURS = ["red", "green", "blue", "yellow", "white", "black"]
_THINGS = ["fox", "bird", "stone", "river", "house", "lamp", "boat", "tree"]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(4)
    a, b = rng.randrange(10), rng.randrange(9)
    if kind == 0:
        return f"{_NUMBERS[a]} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}."
    if kind == 1:
        hi, lo = max(a, b), min(a, b)
        return f"{_NUMBERS[hi]} minus {_NUMBERS[lo]} is {_NUMBERS[hi - lo]}."
    if kind == 2:
        word = "more" if a > b else "less" if a < b else "the same as"
        return f"{_NUMBERS[a]} is {word} {'than ' if a != b else ''}{_NUMBERS[b]}."
    colour, thing = rng.choice(_COLOURS), rng.choice(_THINGS)
    return f"the {colour} {thing} is {rng.choice(['near', 'far from', 'under', 'over'])} the {rng.choice(_THINGS)}."


def generate_corpus(num_bytes: int = 200_000, seed: int = 1234) -> str:
    """``num_bytes`` of generated text (the same text for the same arguments)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < num_bytes:
        line = " ".join(_sentence(rng) for _ in range(rng.randrange(3, 7))) + "\n"
        parts.append(line)
        size += len(line)
    return "".join(parts)[:num_bytes]


def load_tokens(path: str | None = None, num_bytes: int = 200_000) -> torch.Tensor:
    """The token stream: the bytes of ``path``, or of the generated corpus."""
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        data = generate_corpus(num_bytes).encode("utf-8")
    if len(data) < 2:
        raise ValueError(f"the corpus at {path!r} has {len(data)} bytes; it needs at least 2")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


class GPTSamples:
    """Sample ``i`` is a fixed window of the stream: tokens, next-token labels, loss mask, positions."""

    def __init__(self, tokens: torch.Tensor, seq_length: int) -> None:
        if tokens.numel() <= seq_length + 1:
            raise ValueError(f"the corpus has {tokens.numel()} tokens; seq_length {seq_length} needs more")
        self.tokens = tokens
        self.seq_length = seq_length
        self.span = tokens.numel() - seq_length - 1
        # a stride coprime with most spans, so consecutive samples overlap little
        self.stride = seq_length + 7

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = (index * self.stride) % self.span
        window = self.tokens[start:start + self.seq_length + 1]
        return {
            "tokens": window[:-1].clone(),
            "labels": window[1:].clone(),
            "loss_mask": torch.ones(self.seq_length, dtype=torch.float32),
            "position_ids": torch.arange(self.seq_length, dtype=torch.int64),
        }

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Samples stacked along a leading batch dimension."""
        items = [self[i] for i in indices]
        return {key: torch.stack([item[key] for item in items]) for key in items[0]}
