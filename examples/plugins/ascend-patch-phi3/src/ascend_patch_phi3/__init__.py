"""An ascend_patch plugin for Microsoft's Phi-3 family (an example of writing one).

Phi-3 is a llama-shaped decoder whose Hugging Face files fuse two groups of tensors:
``self_attn.qkv_proj`` holds q, k and v stacked by rows, ``mlp.gate_up_proj`` holds the
gate and up projections. The plugin contributes

* a model spec ``phi3`` (``--spec phi3``): HF config -> ModelConfig, megatron-core layer
  spec, and the weight map — the llama map, whose canonical tensors are the unfused ones;
* a loader ``phi3_hf`` that presents the fused tensors as those canonical tensors
  (row ranges of the fused ones: nothing is copied);
* a saver ``phi3_hf`` that writes the fused tensors back, so mg -> HF gives files
  ``transformers`` loads as ``Phi3ForCausalLM``.
"""

__version__ = "0.1.0"
