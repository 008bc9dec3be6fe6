"""Device memory: the HBM of an Ascend chip by name, or a size given as ``64GB``.

Each entry is the HBM one device (one rank) has, with where the figure comes from; see
docs/memory.md ("Chips") for the sources in full. ``--device-memory`` overrides any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import FindingError

__all__ = ["CHIPS", "Chip", "chip", "format_bytes", "parse_size"]

GIB = 1 << 30


@dataclass(frozen=True)
class Chip:
    """One device's HBM and the source of the figure."""

    name: str
    hbm_bytes: int
    source: str


_NPU_SMI = "npu-smi reports HBM-Usage ... / 65536 MB per device"
CHIPS: dict[str, Chip] = {
    "910b1": Chip("Ascend 910B1", 64 * GIB, _NPU_SMI + " on the 910B (A2) family"),
    "910b2": Chip("Ascend 910B2", 64 * GIB, _NPU_SMI + " on the 910B (A2) family"),
    "910b2c": Chip("Ascend 910B2C", 64 * GIB, _NPU_SMI + " on the 910B (A2) family"),
    "910b3": Chip("Ascend 910B3", 64 * GIB, _NPU_SMI + " on the 910B (A2) family"),
    "910b4": Chip("Ascend 910B4", 32 * GIB, "vllm-ascend maintainers: the 910B4 differs from the other 910Bs only in "
                  "its 32 GB of HBM; npu-smi reports / 32768 MB"),
    "910b4-1": Chip("Ascend 910B4-1", 64 * GIB, _NPU_SMI + " (910B4-1)"),
    "a3": Chip("Atlas A3 (one device, i.e. one die)", 64 * GIB,
               "an A3 NPU holds two devices (dies), each a rank; npu-smi reports / 65536 MB for each"),
}
_ALIASES = {"atlas-a3": "a3", "atlas a3": "a3", "910c": "a3", "ascend910_93": "a3"}


def chip(name: str) -> Chip:
    """The chip called ``name`` (``910B3``, ``Ascend910B3``, ``A3``); an unknown name lists the known ones."""
    key = name.strip().lower().replace("ascend", "").strip(" _-") or name.lower()
    key = _ALIASES.get(key, key)
    if key not in CHIPS:
        known = ", ".join(c.upper() if c != "a3" else "A3" for c in CHIPS)
        raise FindingError(f"unknown chip {name!r}; known: {known}", "memory-chip",
                           "or give the device's memory with --device-memory (e.g. 64GB)")
    return CHIPS[key]


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": GIB, "gb": GIB, "gib": GIB, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``64GB`` -> bytes. GB and GiB are both 2**30 (npu-smi's 65536 MB is 64 GB), MB and MiB 2**20."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise FindingError(f"--device-memory {text!r} is not a size", "memory-size", "give it as 64GB, 32768MB or bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int | float) -> str:
    """Bytes as GiB/MiB/KiB with two decimals (``46.34 GiB``)."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
