"""``transformer_engine.pytorch.ops``: TE's operation-based API, present as names and refused when used."""

from __future__ import annotations

from typing import Any

import torch

from ....unsupported import UnsupportedOption

__all__ = ["FusibleOperation", "Sequential"]

# megatron-core's TEFusedMLP (defined at import for TE >= 1.13) annotates its methods with te.pytorch.ops.Sequential
# and te.pytorch.ops.FusibleOperation, which Python evaluates when the class is defined; so the two names exist.
# The op fuser itself (--use-transformer-engine-op-fuser) and TE's activation ops (--use-te-activation-func) are
# not implemented: building one raises, naming the flag; any other name of the module raises the shim's
# missing-name error with the same advice.
ADVICE = ("TE's operation-based API is not provided by ascend_patch's transformer_engine layer; drop "
          "--use-transformer-engine-op-fuser and --use-te-activation-func (megatron-core then builds its MLP and "
          "activation from TE linears and torch)")


class FusibleOperation(torch.nn.Module):
    """TE's base of fusible operations; refused when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedOption(f"transformer_engine.pytorch.ops.{type(self).__name__}: {ADVICE}")


class Sequential(torch.nn.Module):
    """TE's op-fuser container; refused when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedOption(f"transformer_engine.pytorch.ops.Sequential: {ADVICE}")
