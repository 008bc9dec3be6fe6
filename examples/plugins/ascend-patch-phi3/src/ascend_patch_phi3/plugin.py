"""The hook implementations ascend_patch finds through the entry point ``phi3``.

Nothing heavy is imported here: the megatron-core layer spec is imported when a model is
built, so the converter and ``ascend-patch args`` work without megatron-core installed.
"""

from __future__ import annotations

from typing import Any

from ascend_patch.hookspec import hookimpl
from ascend_patch.models.registry import ArgsMatcher, ModelSpec

from . import config


def layer_spec(model_config: Any = None) -> Any:
    """The Phi-3 decoder layer is the llama one (RMSNorm, no q/k norm)."""
    from ascend_patch.models.layer_spec import family_layer_spec

    return family_layer_spec(model_config, normalization="RMSNorm", qk_layernorm=False)


def weight_map(cfg: Any) -> Any:
    """The llama map: its canonical tensors are the unfused q/k/v and gate/up ones."""
    from ascend_patch.models.llama.weights import llama_style_map

    return llama_style_map(cfg)


# A Megatron-LM checkpoint of Phi-3 has llama's arguments; what tells it apart is the tokenizer it was
# trained with (--tokenizer-model microsoft/Phi-3-mini-4k-instruct), which Megatron-LM saves in its args.
MEGATRON_ARGS = ArgsMatcher(values={"normalization": "RMSNorm", "swiglu": True, "qk_layernorm": False,
                                    "add_qkv_bias": False},
                            patterns={"tokenizer_model": r"(?i)phi-?3"})


@hookimpl
def ascend_patch_model_specs() -> list[ModelSpec]:
    return [ModelSpec(
        name="phi3", aliases=("phi-3",), description="Phi-3 (mini/medium, 4k context): llama layer, fused HF tensors",
        config_from_hf=config.config_from_hf, config_to_hf=config.config_to_hf,
        hf_model_types=config.HF_MODEL_TYPES, hf_architectures=config.HF_ARCHITECTURES,
        layer_spec=layer_spec, weight_map=weight_map,
        # the built-in `hf` loader and saver send users to phi3_hf instead of misreading the fused files
        hf_format="phi3_hf",
        # --loader phi3_hf / phi3 imply this family
        loader_aliases=("phi3_hf", "phi3"),
        megatron_args=MEGATRON_ARGS,
    )]


@hookimpl
def ascend_patch_checkpoint_loaders() -> list[Any]:
    from .formats import Phi3Loader

    return [Phi3Loader()]


@hookimpl
def ascend_patch_checkpoint_savers() -> list[Any]:
    from .formats import Phi3Saver

    return [Phi3Saver()]
