"""GPT: Megatron's classic decoder (LayerNorm, GeLU, learned absolute positions, biases).

The family builds models (``--spec gpt``) and reads GPT-2 configs, but does not convert
checkpoints: GPT-2's Hugging Face files store q/k/v fused in transposed ``Conv1D``
weights, which the weight-map rules (row ranges of HF tensors) do not express. Its spec
therefore has no weight map, and the converter says which families it handles.
"""

from ..registry import ModelSpec, lazy
from . import config

__all__ = ["SPEC"]

SPEC = ModelSpec(
    name="gpt",
    description="Megatron's classic GPT: LayerNorm, GeLU, learned absolute positions",
    hf_model_types=config.HF_MODEL_TYPES,
    hf_architectures=config.HF_ARCHITECTURES,
    config_from_hf=config.config_from_hf,
    layer_spec=lazy(f"{__name__}.spec", "layer_spec"),
    weight_map=None,
    traits=config.TRAITS,
)
