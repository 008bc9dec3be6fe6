"""Qwen2 / Qwen2.5: the llama layout plus a bias on the q/k/v projections."""
