"""The device memory that is not tensors: HCCL's buffers, the allocator's margin, the runtime's reservation.

Each is a named line with its source. On the ``cpu`` target every line is 0 and says why.

* HCCL: "each communicator occupies 2 x HCCL_BUFFSIZE memory, used for receiving and sending"
  (CANN, HCCL_BUFFSIZE, default 200 MB). The communicators counted are the process groups
  this rank really ran a collective on in the simulated step (a group that is created but
  never used gets no HCCL communicator: torch_npu creates it at first use).
* Point-to-point: Ascend Extension for PyTorch gives sends and receives their own
  communicators, "each occupying 2 x P2P_HCCL_BUFFSIZE" (default 20 MB from 7.1.0; 0 turns
  them off); counted once per pipeline peer the rank exchanged tensors with.
* The caching allocator's margin: blocks are rounded and split, so reserved memory exceeds
  the live tensor bytes. No vendor figure exists; the margin is a stated fraction of the
  tensor peak (``--allocator-margin``, default 5 %), to be calibrated from a real step
  (``torch.npu.max_memory_reserved() / max_memory_allocated()``).
* The runtime's reservation: npu-smi shows 2874-3419 MB of each 65536 MB device in use
  before any process runs (public npu-smi outputs of 910B and A3 hosts); the default is the
  largest of those readings (``--runtime-reserved``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_MARGIN", "DEFAULT_RUNTIME_RESERVED", "Overhead", "overheads"]

MIB = 1 << 20
DEFAULT_MARGIN = 0.05
DEFAULT_RUNTIME_RESERVED = 3419 * MIB
HCCL_SOURCE = ("CANN HCCL_BUFFSIZE: each communicator occupies 2 x HCCL_BUFFSIZE (https://www.hiascend.com/document/"
               "detail/en/canncommercial/850/commlib/hcclug/hcclug_000076.html)")
P2P_SOURCE = ("Ascend Extension for PyTorch P2P_HCCL_BUFFSIZE: each point-to-point communicator occupies "
              "2 x P2P_HCCL_BUFFSIZE (https://www.hiascend.com/document/detail/zh/Pytorch/710/comref/Envvariables/"
              "Envir_021.html)")


@dataclass(frozen=True)
class Overhead:
    """One non-tensor line: its name, bytes, and where the number comes from (or why it is 0)."""

    name: str
    bytes: int
    source: str


def _megabytes(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value.strip().isdigit() else default


def overheads(target: str, tensor_peak: int, communicators: int, p2p_peers: int, env: Mapping[str, str],
              margin: float = DEFAULT_MARGIN, runtime_reserved: int = DEFAULT_RUNTIME_RESERVED,
              p2p_only_groups: int = 0) -> list[Overhead]:
    """The non-tensor lines of one rank on ``target`` (``npu`` or ``cpu``).

    ``p2p_only_groups`` counts the groups this rank only sent or received on: they get a
    communicator of their own when point-to-point communicators are turned off.
    """
    if target == "cpu":
        why = "the cpu target"
        return [Overhead("HCCL buffers", 0, f"0 on {why}: gloo keeps no device buffers"),
                Overhead("allocator margin", 0, f"0 on {why}: host memory, no caching allocator modelled"),
                Overhead("runtime reservation", 0, f"0 on {why}: no NPU runtime")]
    buff = _megabytes(env, "HCCL_BUFFSIZE", 200)
    p2p = _megabytes(env, "P2P_HCCL_BUFFSIZE", 20)
    if not p2p:
        communicators += p2p_only_groups
    lines = [Overhead("HCCL buffers", communicators * 2 * buff * MIB,
                      f"{communicators} communicator(s) x 2 x HCCL_BUFFSIZE={buff} MB; {HCCL_SOURCE}")]
    if p2p_peers:
        if p2p:
            lines.append(Overhead("HCCL point-to-point buffers", p2p_peers * 2 * p2p * MIB,
                                  f"{p2p_peers} pipeline peer(s) x 2 x P2P_HCCL_BUFFSIZE={p2p} MB; {P2P_SOURCE}"))
        else:
            lines.append(Overhead("HCCL point-to-point buffers", 0,
                                  "P2P_HCCL_BUFFSIZE=0: sends use the pipeline group's communicator, counted above"))
    lines.append(Overhead("allocator margin", math.ceil(tensor_peak * margin),
                          f"{margin:.0%} of the tensor peak: an assumption, not a vendor figure; calibrate with "
                          "torch.npu.max_memory_reserved() / max_memory_allocated() from one real step"))
    lines.append(Overhead("runtime reservation", runtime_reserved,
                          f"{runtime_reserved // MIB} MB in use before any process runs, the largest of public npu-smi "
                          "readings of 910B and A3 devices (2874-3419 MB of 65536 MB)"))
    return lines
