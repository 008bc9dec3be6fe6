"""The cpu target's device module: ``torch.cuda``'s API with meaningful host behaviour.

The host is presented as ``device_count()`` virtual devices (the entries of
``CUDA_VISIBLE_DEVICES`` when set, else a ``torch.multiprocessing.spawn`` child's
``nprocs``, else ``LOCAL_WORLD_SIZE`` when a launcher set it, else 1) so that
``torch.cuda.set_device(local_rank)`` works for every worker; all of them are the same
host memory. Events really time (wall clock), memory
statistics come from the process (resident set and its high-water mark), the RNG
functions act on the generator that host tensors use, and a stream context works
(there is one execution queue, so waiting and synchronising return at once).

Each public callable carries an ``__ascend_action__`` of ``emulated`` or ``no-op``:
the migration report says what a call did.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .cpu_host import (CpuEvent, CpuStream, DeviceContext, StreamContext, check_index, default_stream, device_index,
                       emulated, meminfo, noop, nvtx, peak_rss, reset_peak, rss, state, visible_count)

__all__ = ["CpuDeviceModule", "CpuDeviceProperties", "CpuEvent", "CpuStream", "nvtx"]


class CpuDeviceProperties:
    def __init__(self, index: int) -> None:
        avail, total = meminfo()
        self.name = "cpu (ascend_patch cpu target)"
        self.index = index
        self.total_memory = total
        self.major, self.minor = CpuDeviceModule.CAPABILITY
        self.multi_processor_count = os.cpu_count() or 1
        self.is_integrated = True
        self.is_multi_gpu_board = False
        self.uuid = "cpu"
        # fields CUDA/ROCm property objects carry that libraries read (inductor hashes gcnArchName)
        self.gcnArchName = "cpu"
        self.warp_size = 1
        self.max_threads_per_multi_processor = 1
        self.regs_per_multiprocessor = 0
        self.L2_cache_size = 0
        self.pci_bus_id = self.pci_device_id = self.pci_domain_id = 0

    def __repr__(self) -> str:
        return (f"_CpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")


class CpuDeviceModule:
    """What ``torch.cuda.<name>`` becomes on the cpu target, name for name."""

    # Claims Ampere-level features (bf16, flash attention through the shims); not fp8.
    CAPABILITY = (8, 0)

    Event = CpuEvent
    Stream = CpuStream
    StreamContext = StreamContext
    device = DeviceContext
    nvtx = nvtx
    has_half = True
    has_magma = False

    # device management
    @emulated
    def is_available(self) -> bool:
        return True

    @emulated
    def is_initialized(self) -> bool:
        return True

    @noop
    def init(self) -> None:
        return None

    @emulated
    def device_count(self) -> int:
        return visible_count()

    @emulated
    def current_device(self) -> int:
        return state.index

    @emulated
    def set_device(self, device: Any) -> None:
        index = device_index(device)
        if index >= 0:  # CUDA ignores negative indices
            state.index = check_index(index)

    @emulated
    def device_of(self, obj: Any) -> DeviceContext:
        return DeviceContext(None)

    @noop
    def synchronize(self, device: Any = None) -> None:
        return None

    @emulated
    def get_device_name(self, device: Any = None) -> str:
        return CpuDeviceProperties(device_index(device)).name

    @emulated
    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return self.CAPABILITY

    @emulated
    def get_device_properties(self, device: Any = None) -> CpuDeviceProperties:
        return CpuDeviceProperties(check_index(device_index(device)))

    @emulated
    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True

    @emulated
    def is_tf32_supported(self) -> bool:
        return False

    @emulated
    def get_arch_list(self) -> list[str]:
        return []

    @emulated
    def get_gencode_flags(self) -> str:
        return ""

    @emulated
    def can_device_access_peer(self, device: Any, peer_device: Any) -> bool:
        return True  # every virtual device is the same host memory

    @noop
    def ipc_collect(self) -> None:
        return None

    @emulated
    def get_sync_debug_mode(self) -> int:
        return 0

    @noop
    def set_sync_debug_mode(self, debug_mode: Any) -> None:
        return None

    @emulated
    def is_current_stream_capturing(self) -> bool:
        return False  # graph capture is never under way on the host

    @emulated
    def _lazy_call(self, callable: Callable[[], Any], **kwargs: Any) -> None:
        callable()  # the host is always initialised

    # streams
    @emulated
    def current_stream(self, device: Any = None) -> CpuStream:
        return state.stream if state.stream is not None else default_stream(device_index(device))

    @emulated
    def default_stream(self, device: Any = None) -> CpuStream:
        return default_stream(device_index(device))

    @emulated
    def set_stream(self, stream: CpuStream) -> None:
        state.stream = stream

    @emulated
    def stream(self, stream: CpuStream | None) -> StreamContext:
        return StreamContext(stream)

    # RNG: the generator host tensors draw from
    @property
    def default_generators(self) -> tuple[torch.Generator, ...]:
        return (torch.default_generator,) * visible_count()

    @emulated
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    @emulated
    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    @emulated
    def seed(self) -> None:
        torch.default_generator.seed()

    @emulated
    def seed_all(self) -> None:
        torch.default_generator.seed()

    @emulated
    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    @emulated
    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return torch.default_generator.get_state()

    @emulated
    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.default_generator.set_state(new_state)

    @emulated
    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [torch.default_generator.get_state() for _ in range(visible_count())]

    @emulated
    def set_rng_state_all(self, new_states: Any) -> None:
        for new_state in new_states:
            torch.default_generator.set_state(new_state)

    # memory: the process's resident set
    @emulated
    def memory_allocated(self, device: Any = None) -> int:
        return rss()

    @emulated
    def max_memory_allocated(self, device: Any = None) -> int:
        return peak_rss()

    @emulated
    def memory_reserved(self, device: Any = None) -> int:
        return rss()

    @emulated
    def max_memory_reserved(self, device: Any = None) -> int:
        return peak_rss()

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    @emulated
    def device_memory_used(self, device: Any = None) -> int:
        return rss()

    @emulated
    def reset_peak_memory_stats(self, device: Any = None) -> None:
        reset_peak()

    reset_max_memory_allocated = reset_peak_memory_stats
    reset_max_memory_cached = reset_peak_memory_stats

    @noop
    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        return None

    @emulated
    def memory_stats(self, device: Any = None) -> dict[str, int]:
        cur, peak = rss(), peak_rss()
        stats: dict[str, int] = {}
        for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
            stats[f"{kind}.all.current"] = cur
            stats[f"{kind}.all.peak"] = peak
        stats["num_alloc_retries"] = 0
        stats["num_ooms"] = 0
        return stats

    @emulated
    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        nested: dict[str, Any] = {}
        for key, value in self.memory_stats(device).items():
            node = nested
            *path, last = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return nested

    @emulated
    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        mib = 1024 * 1024
        return (f"cpu target memory (process resident set): current {rss() / mib:.1f} MiB, "
                f"peak {peak_rss() / mib:.1f} MiB")

    @emulated
    def memory_snapshot(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    @emulated
    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return meminfo()

    @noop
    def empty_cache(self) -> None:
        return None

    @noop
    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    @emulated
    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        return 1.0

    @emulated
    def get_allocator_backend(self) -> str:
        return "native"

    @emulated
    def list_gpu_processes(self, device: Any = None) -> str:
        return f"cpu target: one process (pid {os.getpid()}), resident set {rss() // (1024 * 1024)} MiB"

    @emulated
    def host_memory_stats(self) -> dict[str, int]:
        return {}

    @noop
    def reset_peak_host_memory_stats(self) -> None:
        return None

    @noop
    def reset_accumulated_host_memory_stats(self) -> None:
        return None
