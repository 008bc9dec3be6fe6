"""``torch.distributed.ProcessGroupNCCL.Options`` where no NCCL exists, and ``pg_options`` translation.

torch builds without CUDA (the cpu wheel, and the torch that torch_npu runs on) have
no ``ProcessGroupNCCL``, so Megatron's ``get_nccl_options`` (``--nccl-communicator-config-path``,
``high_priority_stream_groups``) fails with AttributeError. The patch adds a
``ProcessGroupNCCL`` whose ``Options`` records what the program set; when such an
object reaches ``init_process_group`` / ``new_group`` as ``pg_options`` it becomes

* on npu: ``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options`` (the documented
  way to configure an HCCL communicator). NCCL's ``config`` fields (``cga_cluster_size``,
  ``min_ctas``, ``max_ctas``, ``net_name``, ...) have no HCCL counterpart; each one
  set is reported;
* on cpu: nothing (gloo takes no such options); the drop is reported.

Constructing ``ProcessGroupNCCL`` itself raises :class:`UnsupportedOnTarget`: groups are
made with ``init_process_group`` / ``new_group``, which translate the backend.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from ..backend import Backend, UnsupportedOnTarget
from ..usage import note

__all__ = ["NcclConfig", "ProcessGroupNCCL", "is_nccl_options", "translate_pg_options"]


class NcclConfig:
    """``ProcessGroupNCCL.Options().config``: NCCL communicator settings, recorded as set."""

    _FIELDS = ("blocking", "cga_cluster_size", "min_ctas", "max_ctas", "net_name", "split_share",
               "traffic_class", "comm_name", "collnet_enable", "cta_policy", "shrink_share", "nvls_ctas")

    def __init__(self) -> None:
        object.__setattr__(self, "_set", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            known = ", ".join(self._FIELDS)
            raise AttributeError(f"ProcessGroupNCCL.Options.config has no field {name!r} (known: {known})")
        self._set[name] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in type(self)._FIELDS:
            raise AttributeError(f"ProcessGroupNCCL.Options.config has no field {name!r}")
        return self.__dict__["_set"].get(name)

    def items(self) -> dict[str, Any]:
        """The fields the program set, by name."""
        return dict(self._set)


class _Options:
    """Stand-in for ``ProcessGroupNCCL.Options`` (the real one needs a CUDA build of torch)."""

    __ascend_patch_nccl_options__ = True

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = bool(is_high_priority_stream)
        self.config = NcclConfig()
        self._timeout: datetime.timedelta | None = None
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""
        self.split_from: Any = None
        self.split_color = 0

    def __repr__(self) -> str:
        return (f"ProcessGroupNCCL.Options(is_high_priority_stream={self.is_high_priority_stream}, "
                f"config={self.config.items()})")


class ProcessGroupNCCL:
    """Stand-in for ``torch.distributed.ProcessGroupNCCL``: its ``Options`` work, the class itself does not."""

    Options = _Options
    NCCLConfig = NcclConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedOnTarget(
            "torch.distributed.ProcessGroupNCCL(...) cannot be built on this target (there is no NCCL); "
            "create groups with torch.distributed.init_process_group/new_group(backend='nccl'), "
            "which ascend_patch maps onto the target's backend")


def is_nccl_options(obj: Any) -> bool:
    """True for our ProcessGroupNCCL.Options stand-in and for a real one (a CUDA build's)."""
    if getattr(type(obj), "__ascend_patch_nccl_options__", False):
        return True
    kind = type(obj)
    return kind.__name__ == "Options" and "NCCL" in getattr(kind, "__qualname__", "")


def _hccl_options_class() -> Any:
    import importlib

    return importlib.import_module("torch_npu._C._distributed_c10d").ProcessGroupHCCL.Options


def translate_pg_options(options: Any, target: Backend,
                         hccl_options: Callable[[], Any] | None = None) -> Any:
    """``pg_options`` for the target: NCCL options become HCCL options (npu) or None (cpu).

    Anything that is not an NCCL options object passes through unchanged.
    ``hccl_options`` builds an empty HCCL options object (default: torch_npu's
    ``ProcessGroupHCCL.Options``); tests pass a stand-in.
    """
    if options is None or not is_nccl_options(options):
        return options
    config = options.config.items() if isinstance(options.config, NcclConfig) else {}
    if target.name != "npu":
        note("torch.distributed.ProcessGroupNCCL.Options (dropped: gloo takes no NCCL options)", "no-op")
        return None
    make = hccl_options or _hccl_options_class()
    hccl = make()
    if getattr(options, "is_high_priority_stream", False):
        # torch_npu documents no high-priority HCCL stream; the flag is carried, HCCL may ignore it.
        try:
            hccl.is_high_priority_stream = True
        except AttributeError:
            note("ProcessGroupNCCL.Options.is_high_priority_stream (no HCCL counterpart)", "no-op")
    timeout = getattr(options, "_timeout", None)
    if timeout is not None:
        try:
            hccl._timeout = timeout
        except AttributeError:
            pass
    for name in sorted(config):
        note(f"ProcessGroupNCCL.Options.config.{name} (no HCCL counterpart)", "no-op")
    note("torch.distributed.ProcessGroupNCCL.Options -> ProcessGroupHCCL.Options", "translated")
    return hccl
