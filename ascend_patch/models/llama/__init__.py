"""Llama (and Mistral-style llama variants): GQA, RMSNorm, SwiGLU, RoPE, untied embeddings."""
