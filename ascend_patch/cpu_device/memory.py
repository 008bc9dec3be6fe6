"""Memory statistics of the cpu target: the process's resident set and its high-water mark."""

from __future__ import annotations

import os

__all__ = ["meminfo", "peak_rss", "reset_peak", "rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_observed = [0]  # the largest resident set size a caller has seen since the last reset


def rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            value = int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        value = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    if value > _observed[0]:
        _observed[0] = value
    return value


def peak_rss() -> int:
    # The kernel's high-water mark is kept from lazily synced counters, so it can trail a
    # value already reported; the peak is never below anything reported.
    peak = rss()
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    return max(peak, _observed[0])


def reset_peak() -> None:
    _observed[0] = 0
    try:  # Linux: writing 5 resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def meminfo() -> tuple[int, int]:
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return avail, total
