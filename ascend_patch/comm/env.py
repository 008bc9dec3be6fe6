"""``NCCL_*`` / ``TORCH_NCCL_*`` environment variables onto the target's collective library.

On npu each variable with an HCCL (or torch_npu) counterpart is carried over
(``EnvVar`` patches: set before the first process group is made; a counterpart the
user set already wins; ``remove()`` restores the environment), converted where the
units differ (``NCCL_BUFFSIZE`` bytes -> ``HCCL_BUFFSIZE`` MB). On cpu the one
variable gloo has a counterpart for, ``NCCL_SOCKET_IFNAME`` -> ``GLOO_SOCKET_IFNAME``,
is carried over. Every other ``NCCL_*`` / ``TORCH_NCCL_*`` variable that is set does
nothing on the target; :func:`nccl_environment` says so for each, and the migration
report lists it (action ``no-op``).

Counterparts (from the CANN and torch_npu environment-variable references):

=================================  ==============================  ==========================
NCCL / torch                       npu                             note
=================================  ==============================  ==========================
NCCL_SOCKET_IFNAME                 HCCL_SOCKET_IFNAME              same prefix-list syntax
NCCL_SOCKET_FAMILY                 HCCL_SOCKET_FAMILY              AF_INET / AF_INET6
NCCL_IB_TIMEOUT                    HCCL_RDMA_TIMEOUT               both 4.096 us x 2^value; 5..24
NCCL_IB_RETRY_CNT                  HCCL_RDMA_RETRY_CNT             1..7
NCCL_IB_TC                         HCCL_RDMA_TC                    0..255, a multiple of 4
NCCL_IB_SL                         HCCL_RDMA_SL                    0..7
NCCL_BUFFSIZE                      HCCL_BUFFSIZE                   bytes -> MB (rounded up)
TORCH_NCCL_BLOCKING_WAIT           TORCH_HCCL_BLOCKING_WAIT        (also NCCL_BLOCKING_WAIT)
TORCH_NCCL_ASYNC_ERROR_HANDLING    HCCL_ASYNC_ERROR_HANDLING       (also NCCL_ASYNC_ERROR_HANDLING)
TORCH_NCCL_DESYNC_DEBUG            HCCL_DESYNC_DEBUG               (also NCCL_DESYNC_DEBUG)
=================================  ==============================  ==========================
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..patch import Action, EnvVar, Patch

__all__ = ["EnvFinding", "NPU_COUNTERPARTS", "CPU_COUNTERPARTS", "env_patches", "nccl_environment", "note_unmapped"]


def _same(value: str) -> str:
    return value


def _int_in(low: int, high: int, multiple: int = 1) -> Callable[[str], str]:
    def convert(value: str) -> str:
        number = int(value.strip())
        if not low <= number <= high or number % multiple:
            extra = f" and a multiple of {multiple}" if multiple > 1 else ""
            raise ValueError(f"the counterpart accepts {low}..{high}{extra}")
        return str(number)

    return convert


def _bytes_to_mb(value: str) -> str:
    number = int(value.strip())
    if number <= 0:
        raise ValueError("a buffer size must be positive")
    return str(max(1, math.ceil(number / (1024 * 1024))))


def _family(value: str) -> str:
    if value.strip() not in ("AF_INET", "AF_INET6"):
        raise ValueError("the counterpart accepts AF_INET or AF_INET6")
    return value.strip()


def _gloo_ifname(value: str) -> str:
    # gloo takes exact interface names; NCCL's '^' (exclude) and '=' (exact) prefixes have no gloo form
    if value.startswith(("^", "=")):
        raise ValueError("GLOO_SOCKET_IFNAME takes plain interface names (no '^' or '=' prefix)")
    return value


# NCCL variable -> (counterpart, converter)
NPU_COUNTERPARTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "NCCL_SOCKET_IFNAME": ("HCCL_SOCKET_IFNAME", _same),
    "NCCL_SOCKET_FAMILY": ("HCCL_SOCKET_FAMILY", _family),
    "NCCL_IB_TIMEOUT": ("HCCL_RDMA_TIMEOUT", _int_in(5, 24)),
    "NCCL_IB_RETRY_CNT": ("HCCL_RDMA_RETRY_CNT", _int_in(1, 7)),
    "NCCL_IB_TC": ("HCCL_RDMA_TC", _int_in(0, 255, 4)),
    "NCCL_IB_SL": ("HCCL_RDMA_SL", _int_in(0, 7)),
    "NCCL_BUFFSIZE": ("HCCL_BUFFSIZE", _bytes_to_mb),
    "TORCH_NCCL_BLOCKING_WAIT": ("TORCH_HCCL_BLOCKING_WAIT", _same),
    "NCCL_BLOCKING_WAIT": ("TORCH_HCCL_BLOCKING_WAIT", _same),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("HCCL_ASYNC_ERROR_HANDLING", _same),
    "NCCL_ASYNC_ERROR_HANDLING": ("HCCL_ASYNC_ERROR_HANDLING", _same),
    "TORCH_NCCL_DESYNC_DEBUG": ("HCCL_DESYNC_DEBUG", _same),
    "NCCL_DESYNC_DEBUG": ("HCCL_DESYNC_DEBUG", _same),
}
CPU_COUNTERPARTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "NCCL_SOCKET_IFNAME": ("GLOO_SOCKET_IFNAME", _gloo_ifname),
}


@dataclass(frozen=True)
class EnvFinding:
    """One NCCL variable found in the environment and what it becomes on the target."""

    name: str
    value: str
    counterpart: str | None  # the variable it maps to, None when there is none
    counterpart_value: str | None  # what the counterpart is (or will be) set to
    detail: str

    @property
    def effective(self) -> bool:
        return self.counterpart is not None and self.counterpart_value is not None


def _table(target: str) -> dict[str, tuple[str, Callable[[str], str]]]:
    return NPU_COUNTERPARTS if target == "npu" else CPU_COUNTERPARTS


def _is_nccl_name(name: str) -> bool:
    return name.startswith(("NCCL_", "TORCH_NCCL_"))


def nccl_environment(target: str, environ: Mapping[str, str] | None = None) -> list[EnvFinding]:
    """Every ``NCCL_*`` / ``TORCH_NCCL_*`` variable set in ``environ`` and its fate on ``target``."""
    env = os.environ if environ is None else environ
    table = _table(target)
    lib = "HCCL" if target == "npu" else "gloo"
    findings = []
    # the canonical TORCH_NCCL_* name wins over its deprecated NCCL_* alias, as in torch
    ordered = sorted((n for n in env if _is_nccl_name(n)), key=lambda n: (not n.startswith("TORCH_"), n))
    claimed: dict[str, str] = {}
    for name in ordered:
        value = env[name]
        entry = table.get(name)
        if entry is None:
            findings.append(EnvFinding(name, value, None, None,
                                       f"{name} has no {lib} counterpart; it has no effect on the {target} target"))
            continue
        counterpart, convert = entry
        if counterpart in claimed:
            findings.append(EnvFinding(name, value, counterpart, env.get(counterpart),
                                       f"{counterpart} already comes from {claimed[counterpart]}"))
            continue
        if env.get(counterpart) is not None and counterpart not in claimed:
            claimed[counterpart] = counterpart
            findings.append(EnvFinding(name, value, counterpart, env[counterpart],
                                       f"{counterpart} is set already ({env[counterpart]!r}) and wins"))
            continue
        try:
            converted = convert(value)
        except ValueError as exc:
            findings.append(EnvFinding(name, value, counterpart, None,
                                       f"{name}={value!r} is not carried over to {counterpart}: {exc}"))
            continue
        claimed[counterpart] = name
        findings.append(EnvFinding(name, value, counterpart, converted, f"{name} -> {counterpart}={converted}"))
    return findings


def env_patches(target: str) -> list[Patch]:
    """ENV patches setting each counterpart from its NCCL variable (target ``npu`` or ``cpu``)."""
    patches = []
    backends = frozenset({target})
    for counterpart in sorted({c for c, _ in _table(target).values()}):
        def make(current: str | None, counterpart: str = counterpart) -> str | None:
            if current is not None:
                return current
            for finding in nccl_environment(target):
                if finding.counterpart == counterpart and finding.effective:
                    return finding.counterpart_value
            return None

        sources = sorted(n for n, (c, _) in _table(target).items() if c == counterpart)
        patches.append(EnvVar(counterpart, f"{' / '.join(sources)} carries over to {counterpart}",
                              make=make, backends=backends, action=Action.TRANSLATED, api=sources[0]))
    return patches


def note_unmapped(target: str) -> None:
    """Record, for the migration report, each NCCL variable that does nothing on the target."""
    from ..usage import note

    for finding in nccl_environment(target):
        if not finding.effective:
            note(f"environment {finding.name}", "no-op")
