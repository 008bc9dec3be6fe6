"""Model families: the spec registry, HF config mapping, megatron-core layer specs, weight maps."""
