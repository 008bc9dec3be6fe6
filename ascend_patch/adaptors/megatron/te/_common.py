"""What every module of the transformer_engine layer shares: the target device, extra state, refusals."""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch

from ....backend import current_target
from ....unsupported import UnsupportedOption

__all__ = ["TEModule", "refuse", "target_device", "tp_size_of"]


def target_device(device: Any) -> Any:
    """TE's ``device`` argument on the target: "cuda", ``cuda:N``, an int (``torch.cuda.current_device()``)
    or None become the target's device; "cpu" and "meta" stay."""
    if isinstance(device, torch.device):
        kind, index = device.type, device.index
    elif isinstance(device, int):
        kind, index = "cuda", device
    elif device is None:
        kind, index = "cuda", None
    else:
        parsed = torch.device(device)
        kind, index = parsed.type, parsed.index
    if kind in ("cpu", "meta"):
        return torch.device(kind, index)
    return current_target().device(index)


def tp_size_of(tp_group: Any, tp_size: int) -> int:
    """TE's rule: the group's size when a group is given, else ``tp_size``."""
    if tp_group is None:
        return int(tp_size)
    return tp_group.size() if hasattr(tp_group, "size") else torch.distributed.get_world_size(tp_group)


def refuse(api: str, option: str, why: str, instead: str) -> UnsupportedOption:
    """The error for a TE option the layer does not implement: what, why, what to do instead."""
    return UnsupportedOption(f"transformer_engine.pytorch.{api}({option}) is not supported by ascend_patch's "
                               f"transformer_engine layer: {why}; {instead}")


class TEModule(torch.nn.Module):
    """TE's module base: ``_extra_state`` in the state dict (empty: no FP8 scaling state)."""

    _warned_fp8_state = False

    def get_extra_state(self) -> torch.Tensor:
        # TE 2.x writes an empty uint8 tensor when no FP8 state exists; checkpoints stay loadable by real TE
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        if state is None:
            return
        if isinstance(state, torch.Tensor) and state.numel() == 0:
            return
        if isinstance(state, io.BytesIO) and len(state.getbuffer()) == 0:
            return
        if not TEModule._warned_fp8_state:
            TEModule._warned_fp8_state = True
            warnings.warn(f"{type(self).__name__}: the checkpoint holds Transformer Engine FP8 scaling state "
                          "(amax history, scales); it is ignored, this layer trains in full precision", stacklevel=2)
