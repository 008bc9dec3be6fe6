"""What every model of a family is (:class:`Traits`) and how its Megatron checkpoints look (:class:`ArgsMatcher`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigMismatch

__all__ = ["MEGATRON_ARG_DEFAULTS", "ArgsMatcher", "Traits", "megatron_arg"]

# what Megatron-LM's argument parser gives an argument a checkpoint's args do not hold
MEGATRON_ARG_DEFAULTS: dict[str, Any] = {"normalization": "LayerNorm", "swiglu": False, "qk_layernorm": False,
                                         "add_qkv_bias": False, "add_bias_linear": True,
                                         "position_embedding_type": "learned_absolute"}


def megatron_arg(args: Any, name: str) -> Any:
    """``name`` of a checkpoint's ``args`` (a mapping or a namespace), Megatron's default where it is absent."""
    value = args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)
    return MEGATRON_ARG_DEFAULTS.get(name) if value is None else value


@dataclass(frozen=True)
class ArgsMatcher:
    """How a family's Megatron checkpoints look in their saved ``args``.

    Every entry of ``values`` must hold (an absent argument has Megatron's default) and
    every regular expression of ``patterns`` must be found in its argument's text.
    Calling the matcher gives its score: 0 when it does not match, else the number of
    facts it checked; the highest score wins and a tie is an error. A family that refines
    another (Phi-3 is llama's arguments plus its tokenizer) lists the other's facts too.
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    patterns: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, args: Any) -> int:
        for name, want in self.values.items():
            if megatron_arg(args, name) != want:
                return 0
        for name, pattern in self.patterns.items():
            value = megatron_arg(args, name)
            if value is None or not re.search(pattern, str(value)):
                return 0
        return len(self.values) + len(self.patterns)

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.values, *self.patterns)


@dataclass(frozen=True)
class Traits:
    """What every model of a family is, stated once in its folder (``config.py``'s ``TRAITS``).

    Read by the config map (:func:`.hf_config.load_hf_config`), the weight map, the layer
    spec and :attr:`ModelSpec.megatron_args` (each stated trait is a fact of the family's
    :class:`ArgsMatcher`). ``qk_norm`` / ``qkv_bias``: True, every model has it; False, none
    has (a config asking for it is refused); None, as each model's config says (no fact).
    ``tied`` is ``tie_word_embeddings`` when config.json does not say; ``moe``: every MLP a
    router over experts (then a Megatron checkpoint must name its experts).
    """

    normalization: str = "RMSNorm"
    swiglu: bool = True
    qk_norm: bool | None = False
    qkv_bias: bool | None = False
    tied: bool = False
    moe: bool = False

    def args_matcher(self) -> ArgsMatcher:
        """The facts a Megatron-LM checkpoint of this family has in its ``args``."""
        values: dict[str, Any] = {"normalization": self.normalization, "swiglu": self.swiglu}
        if self.qk_norm is not None:
            values["qk_layernorm"] = self.qk_norm
        if self.qkv_bias is not None:
            values["add_qkv_bias"] = self.qkv_bias
        return ArgsMatcher(values, patterns={"num_experts": r"^[1-9]"} if self.moe else {})

    def resolve(self, family: str, qk_layernorm: bool, add_qkv_bias: bool) -> tuple[bool, bool]:
        """(q/k norm, q/k/v bias) of one model whose config says ``qk_layernorm`` / ``add_qkv_bias``;
        a config asking for what the family never has is refused, rather than dropped."""
        for trait, said, what in ((self.qk_norm, qk_layernorm, "q/k layernorm (qk_layernorm)"),
                                  (self.qkv_bias, add_qkv_bias, "a q/k/v bias (attention_bias / add_qkv_bias)")):
            if trait is False and said:
                raise ConfigMismatch(f"{family} models have no {what}, but this config asks for one; pass the "
                                     "family that has it (--model-type-hf)")
        return (qk_layernorm if self.qk_norm is None else self.qk_norm,
                add_qkv_bias if self.qkv_bias is None else self.qkv_bias)
