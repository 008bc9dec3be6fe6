"""Transformer Engine's FP8 entry points, as far as megatron-core touches them without FP8.

The targets have no FP8 GEMMs, so nothing here quantizes. What megatron-core needs to
*import* and to run in full precision is real:

* the recipe classes (``transformer_engine.common.recipe``): plain configuration records
  with TE's fields, so megatron can subclass ``DelayedScaling`` at import time;
* ``FP8GlobalStateManager``: answers "FP8 is off" (``is_fp8_enabled()`` False, no recipe);
* ``fp8_autocast`` / ``fp8_model_init`` with ``enabled=False`` are no-op contexts (megatron
  opens them to *force* full precision); with ``enabled=True`` they raise
  :class:`FP8Unavailable`, which names Megatron-LM's flags;
* ``QuantizedTensor`` / ``Float8Tensor``: types for megatron's ``isinstance`` checks. No
  tensor is ever one on these targets; constructing one raises :class:`FP8Unavailable`;
* the queries code asks before it decides (``check_fp8_support`` and its MXFP8, NVFP4 and
  block-scaling siblings, ``FP8GlobalStateManager.is_*_available``): ``(False, reason)``, the
  reason naming the target; ``check_recipe_support`` raises :class:`FP8Unavailable`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from ....backend import UnsupportedOnTarget

__all__ = [
    "DelayedScaling",
    "FP8GlobalStateManager",
    "FP8Unavailable",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Float8Tensor",
    "Format",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "QuantizedTensor",
    "Recipe",
    "check_fp8_block_scaling_support",
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_recipe_support",
    "fp8_autocast",
    "fp8_model_init",
    "fp8_unavailable",
]

FP8_FLAGS = ("--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--fp4-format", "--fp4-param")


class FP8Unavailable(UnsupportedOnTarget):
    """FP8/FP4 was asked for on a target without FP8 kernels."""


def fp8_unavailable(what: str, target: str | None = None) -> FP8Unavailable:
    """The error for FP8/FP4 asked for on the target, naming what asked and what to do."""
    where = f"the {target} target" if target else "this target"
    return FP8Unavailable(
        f"{what}: FP8/FP4 training needs NVIDIA Transformer Engine's FP8 kernels, which {where} does not have "
        f"(ascend_patch's transformer_engine layer runs full precision only). Drop "
        f"{', '.join(FP8_FLAGS)} from the Megatron-LM command line (TransformerConfig.fp8 / fp4 / fp8_param "
        f"= None/False) and train in bf16 (--bf16) or fp32")


def _no_support(kind: str) -> tuple[bool, str]:
    from ....backend import active_backend

    target = active_backend()
    where = f"the {target.name} target" if target is not None else "this target"
    return False, (f"{kind} is not supported: {where} has no FP8 kernels (Transformer Engine is not installed; "
                   "ascend_patch's transformer_engine layer runs bf16/fp16/fp32 only)")


def check_fp8_support() -> tuple[bool, str]:
    """TE's query "can this device run FP8?": ``(False, why)`` on these targets."""
    return _no_support("FP8")


def check_mxfp8_support() -> tuple[bool, str]:
    """TE's MXFP8 query: ``(False, why)``."""
    return _no_support("MXFP8")


def check_nvfp4_support() -> tuple[bool, str]:
    """TE's NVFP4 query: ``(False, why)``."""
    return _no_support("NVFP4")


def check_fp8_block_scaling_support() -> tuple[bool, str]:
    """TE's FP8 block-scaling query: ``(False, why)``."""
    return _no_support("FP8 block scaling")


def check_recipe_support(recipe: Any) -> None:
    """TE's check before a recipe is used: every recipe is refused here, naming the flags."""
    raise fp8_unavailable(f"transformer_engine.pytorch.fp8.check_recipe_support({type(recipe).__name__})")


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """TE's FP8 formats (E4M3, E5M2, HYBRID = E4M3 forward / E5M2 backward)."""

    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


class Recipe:
    """Base of TE's quantization recipes (configuration only)."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_block_scaling(self) -> bool:
        return isinstance(self, Float8BlockScaling)

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def nvfp4(self) -> bool:
        return isinstance(self, NVFP4BlockScaling)


@dataclasses.dataclass
class DelayedScaling(Recipe):
    """TE's delayed-scaling recipe (fields as in TE 2.x)."""

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    scaling_factor_compute_algo: Any = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    interval: int = 1


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """TE's per-tensor current-scaling recipe."""

    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """TE's block-scaling recipe."""

    fp8_format: Format = Format.E4M3


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """TE's MXFP8 recipe."""

    fp8_format: Format = Format.E4M3


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """TE's NVFP4 recipe."""


class FP8GlobalStateManager:
    """TE's global FP8 state, which on these targets is always "off"."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return False

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return False

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return False

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        return False

    @classmethod
    def get_fp8_recipe(cls) -> None:
        return None

    @classmethod
    def get_fp8_group(cls) -> None:
        return None

    @classmethod
    def is_fp8_available(cls) -> tuple[bool, str]:
        return check_fp8_support()

    @classmethod
    def is_mxfp8_available(cls) -> tuple[bool, str]:
        return check_mxfp8_support()

    @classmethod
    def is_fp8_block_scaling_available(cls) -> tuple[bool, str]:
        return check_fp8_block_scaling_support()

    @classmethod
    def is_nvfp4_available(cls) -> tuple[bool, str]:
        return check_nvfp4_support()


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Any = None, fp8_group: Any = None,
                 _graph: bool = False) -> Iterator[None]:
    """TE's ``fp8_autocast``: a no-op when ``enabled=False``; FP8 itself raises :class:`FP8Unavailable`."""
    if enabled or calibrating:
        raise fp8_unavailable(f"transformer_engine.pytorch.fp8_autocast(enabled={enabled}, calibrating={calibrating})")
    yield


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe: Any = None,
                   preserve_high_precision_init_val: bool = False) -> Iterator[None]:
    """TE's ``fp8_model_init`` (FP8 primary weights): a no-op when ``enabled=False``."""
    if enabled:
        raise fp8_unavailable("transformer_engine.pytorch.fp8_model_init(enabled=True) (--fp8-param-gather)")
    yield


class QuantizedTensor(torch.Tensor):
    """TE's base class of quantized tensors: a type for ``isinstance`` checks; none exists on these targets."""

    def __new__(cls, *args: Any, **kwargs: Any) -> QuantizedTensor:
        raise fp8_unavailable(f"{cls.__name__}(...)")


class Float8Tensor(QuantizedTensor):
    """TE's FP8 tensor type (see :class:`QuantizedTensor`)."""
