"""The one table of tensor dtypes: torch's names, their spellings elsewhere, their sizes.

The canonical name is torch's (``"bfloat16"``). Hugging Face configs, Megatron flags and
file formats spell the same dtype otherwise — ``bf16`` (Megatron's ``--bf16``, the
converter's ``--params-dtype``), ``BF16`` (safetensors headers), ``BFloat16Storage``
(the legacy storage class in a ``torch.save`` pickle), ``torch.bfloat16`` (``str()`` of
a torch dtype), ``half`` / ``float`` (older configs) — and every one of them is
translated here. Nothing here imports torch except :func:`torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import AscendPatchError

__all__ = [
    "DType",
    "DTYPES",
    "FLOATING",
    "SHORT_NAMES",
    "UnknownDType",
    "canonical",
    "from_safetensors",
    "itemsize",
    "short_name",
    "torch_dtype",
]


@dataclass(frozen=True)
class DType:
    """One dtype: torch's name, bytes per element, its safetensors code and legacy storage class."""

    name: str
    itemsize: int
    safetensors: str
    storage: str
    short: str | None = None  # Megatron's spelling (--bf16), for the floating dtypes training uses

    @property
    def floating(self) -> bool:
        """A floating dtype a model's parameters (and the converter's output) may have."""
        return self.short is not None


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float32", 4, "F32", "FloatStorage", "fp32"),
    DType("bfloat16", 2, "BF16", "BFloat16Storage", "bf16"),
    DType("float16", 2, "F16", "HalfStorage", "fp16"),
    DType("float64", 8, "F64", "DoubleStorage"),
    DType("int64", 8, "I64", "LongStorage"),
    DType("int32", 4, "I32", "IntStorage"),
    DType("int16", 2, "I16", "ShortStorage"),
    DType("int8", 1, "I8", "CharStorage"),
    DType("uint8", 1, "U8", "ByteStorage"),
    DType("bool", 1, "BOOL", "BoolStorage"),
)}

# the floating dtypes by their short spelling: {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
SHORT_NAMES: dict[str, str] = {d.short: d.name for d in DTYPES.values() if d.short}
FLOATING: tuple[str, ...] = tuple(SHORT_NAMES.values())
# the other spellings HF configs use (torch's own aliases: torch.float is float32, torch.half float16)
_ALIASES = {**SHORT_NAMES, "float": "float32", "half": "float16"}
_BY_CODE = {d.safetensors: d.name for d in DTYPES.values()}


class UnknownDType(AscendPatchError, ValueError):
    """A dtype name no table here knows."""


def canonical(dtype: object) -> str:
    """torch.bfloat16 / ``"torch.bfloat16"`` / ``"bf16"`` / ``"half"`` -> torch's name (``"bfloat16"``).

    A name that is none of these comes back as given (without a ``torch.`` prefix), so
    callers that only pass names through never fail here; :func:`itemsize` refuses it.
    """
    text = str(dtype).replace("torch.", "")
    return _ALIASES.get(text, text)


def itemsize(dtype: object) -> int:
    """Bytes per element of ``dtype`` (any spelling :func:`canonical` knows)."""
    found = DTYPES.get(canonical(dtype))
    if found is None:
        raise UnknownDType(f"unsupported tensor dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return found.itemsize


def short_name(dtype: object, default: str | None = None) -> str:
    """``"bfloat16"`` (any spelling) -> Megatron's ``"bf16"``; ``default`` for a non-floating or unknown one."""
    found = DTYPES.get(canonical(dtype))
    if found is not None and found.short is not None:
        return found.short
    if default is None:
        raise UnknownDType(f"{dtype!r} is not a floating dtype a model is trained in; use one of "
                           f"{', '.join(SHORT_NAMES)}")
    return default


def from_safetensors(code: str) -> str | None:
    """A safetensors header's dtype code (``"BF16"``) -> torch's name, None when unknown."""
    return _BY_CODE.get(code)


def torch_dtype(dtype: object) -> Any:
    """The ``torch.dtype`` for any spelling (imports torch)."""
    import torch

    return getattr(torch, canonical(dtype))
