"""GPT: Megatron's classic decoder (LayerNorm, GeLU, learned absolute positions, biases)."""
