"""MindSpeed-LLM's converter checkpoints in ``ascend-patch convert``: loader ``mindspeed_llm`` (alias ``msl``).

MindSpeed-LLM's ``convert_ckpt_v2.py`` writes Megatron's legacy layout (iteration 1, local-spec
keys, no optimizer or RNG state) whose ``args`` hold config.json's own keys
(``num_key_value_heads``, ``intermediate_size``, ``head_dim``, ``torch_dtype``), a few Megatron
names, and ``group_query_attention=False`` whatever the model: read as Megatron-LM's args they
describe another model. This loader is the legacy Megatron loader with those args first put in
Megatron-LM's names (:func:`megatron_args`); stock Megatron-LM itself loads the checkpoint as
it is (its checks read only sizes and parallel layout, which are right).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .rules import MigrationError

__all__ = ["MindSpeedLLMLoader", "is_mindspeed_llm_args", "megatron_args"]

FAMILIES = {"qwen3": "qwen3", "qwen3-moe": "qwen3_moe", "llama2": "llama", "qwen25": "qwen2", "mixtral": "mixtral"}


def is_mindspeed_llm_args(args: Any) -> bool:
    """Whether a checkpoint's ``args`` were packed by MindSpeed-LLM's converter (HF keys next to Megatron ones)."""
    return hasattr(args, "model_type_hf") and hasattr(args, "num_key_value_heads")


def megatron_args(args: Any) -> argparse.Namespace:
    """MindSpeed-LLM's packed ``args`` with the fields Megatron-LM names its own (the rest kept)."""
    fields = dict(vars(args))
    heads = int(fields["num_attention_heads"])
    groups = int(fields.get("num_key_value_heads") or heads)
    fields.update(num_query_groups=groups, group_query_attention=groups != heads)
    if fields.get("intermediate_size") is not None:
        fields["ffn_hidden_size"] = int(fields["intermediate_size"])
    if fields.get("moe_intermediate_size") is not None:
        fields["moe_ffn_hidden_size"] = int(fields["moe_intermediate_size"])
    if fields.get("num_experts_per_tok") is not None:
        fields["moe_router_topk"] = int(fields["num_experts_per_tok"])
    if fields.get("use_rotary_position_embeddings"):
        fields["position_embedding_type"] = "rope"
    if fields.get("torch_dtype") and "params_dtype" not in fields:
        fields["params_dtype"] = str(fields["torch_dtype"])
    return argparse.Namespace(**fields)


@contextlib.contextmanager
def _reading_msl_args() -> Iterator[None]:
    # The legacy loader reads sizes through megatron_args.config_from_args; it is given the renamed args
    # while this loader runs (the loaders package has no hook for an args normaliser yet).
    from ..loaders import megatron as legacy

    original = legacy.config_from_args

    def config_from_args(args: Any, *rest: Any, **kwargs: Any) -> Any:
        return original(megatron_args(args) if is_mindspeed_llm_args(args) else args, *rest, **kwargs)

    legacy.config_from_args = config_from_args
    try:
        yield
    finally:
        legacy.config_from_args = original


def _first_args(path: str) -> Any:
    from ..loaders.megatron_layout import RANK_FILE, tracked_iteration
    from ..loaders.torch_io import safe_load

    tracked = tracked_iteration(path)
    root = tracked[0] if tracked else path
    for entry in sorted(os.listdir(root)):
        file = os.path.join(root, entry, RANK_FILE)
        if entry.startswith("mp_rank_") and os.path.isfile(file):
            return safe_load(file).get("args")
    raise MigrationError(f"{path}: no iter_*/mp_rank_*/{RANK_FILE}")


def _loader_class() -> type:
    from ..loaders.megatron import MegatronLoader

    class MindSpeedLLMLoader(MegatronLoader):
        """The legacy Megatron loader for checkpoints MindSpeed-LLM's converter wrote."""

        name = "mindspeed_llm"
        aliases = ("msl", "mindspeed-llm")
        description = "MindSpeed-LLM convert_ckpt_v2.py output: Megatron legacy layout, args packed from config.json"

        def detect(self, path: str) -> bool:
            try:
                return super().detect(path) and is_mindspeed_llm_args(_first_args(path))
            except Exception:
                return False

        def open(self, path: str, options: Any) -> Any:
            import dataclasses

            args = _first_args(path)
            if not is_mindspeed_llm_args(args):
                raise MigrationError(f"{path} was not written by MindSpeed-LLM's converter (its args have no "
                                     "model_type_hf / num_key_value_heads); use --load-model-type mg")
            if not options.model_type_hf:
                family = FAMILIES.get(str(args.model_type_hf), str(args.model_type_hf))
                options = dataclasses.replace(options, model_type_hf=family)
            if not options.true_vocab_size and getattr(args, "vocab_size", None):
                options = dataclasses.replace(options, true_vocab_size=int(args.vocab_size))
            with _reading_msl_args():
                source = super().open(path, options)
            source.format = self.name
            return source

    return MindSpeedLLMLoader


def __getattr__(name: str) -> Any:  # the class needs the loaders package, imported only when asked for
    if name == "MindSpeedLLMLoader":
        return _loader_class()
    raise AttributeError(name)
