"""Qwen3: q/k RMSNorm per head, an explicit head_dim, tied embeddings in the small sizes."""
