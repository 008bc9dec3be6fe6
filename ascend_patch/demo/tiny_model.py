"""A tiny Qwen3-shaped Hugging Face checkpoint and a byte-level tokenizer, made locally.

Nothing is downloaded: the weights are random (seeded) and the tokenizer maps every byte
to the token id equal to its value, which is exactly how ``examples/gpt_data.py``
tokenises the training corpus, so the model trained there speaks this tokenizer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TinyQwen3", "byte_tokenizer", "make_tiny_qwen3"]

NEWLINE = 10  # the end-of-text token: the corpus is one sentence group per line


@dataclass(frozen=True)
class TinyQwen3:
    """The demo model's shape (Qwen3: q/k norm, explicit head_dim, tied embeddings)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 128
    seed: int = 0


def _byte_chars() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE uses for it (bytes that are printable
    latin-1 stand for themselves, the rest are moved above U+0100)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, moved = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + moved)
            moved += 1
    return chars


def byte_tokenizer():
    """A ``PreTrainedTokenizerFast`` whose token ids are the UTF-8 bytes of the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _byte_chars()
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in chars.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=chars[NEWLINE])


def make_tiny_qwen3(path: str, shape: TinyQwen3 = TinyQwen3()) -> dict[str, object]:
    """Write a random tiny Qwen3 (safetensors, config.json, tokenizer) to ``path``; returns its config."""
    import torch
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=256, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings, tie_word_embeddings=True,
        rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=NEWLINE, eos_token_id=NEWLINE,
        pad_token_id=NEWLINE)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(shape.seed)
    model = transformers.Qwen3ForCausalLM(config).float()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return config.to_dict()
