"""Which CUDA APIs the program actually called: counts, first call site, what was done.

Recording exists only while the migration report is on. Replacements built when it
is off contain no recording code at all, so the hot path pays nothing; the patch
manager rebuilds them when reporting is switched on.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from types import FrameType

__all__ = ["ApiUse", "UsageRecorder", "active_recorder", "note", "set_recorder"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_PKG_DIR + os.sep,)
try:
    import wrapt as _wrapt

    _SKIP_DIRS += (os.path.dirname(os.path.abspath(_wrapt.__file__)) + os.sep,)
except Exception:  # pragma: no cover - wrapt is a dependency
    pass


@dataclass
class ApiUse:
    api: str
    action: str
    calls: int
    first_site: str


def _library_dirs() -> tuple[str, ...]:
    """Where installed packages and the standard library live: frames there are not the program's."""
    import sysconfig

    dirs = set()
    for scheme_path in ("purelib", "platlib", "stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(scheme_path)
        if path:
            dirs.add(os.path.realpath(path) + os.sep)
            dirs.add(os.path.abspath(path) + os.sep)
    import site

    for path in [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]:
        dirs.add(os.path.abspath(path) + os.sep)
    return tuple(sorted(dirs))


_LIBRARY_DIRS = _library_dirs()


def _call_site(frame: FrameType | None) -> str:
    """The first frame in the program's own code (not torch/random.py); else the first outside ascend_patch."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?"
    first = frame
    while frame is not None:
        name = frame.f_code.co_filename
        # ascend_patch's own frames again: a patched call that runs torch, which calls a CUDA API
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<") and not name.startswith(_SKIP_DIRS):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return f"{first.f_code.co_filename}:{first.f_lineno}"  # only library code called it (a thread, atexit)


class UsageRecorder:
    """Thread-safe tally of API uses keyed by API name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uses: dict[str, ApiUse] = {}

    def hit(self, api: str, action: str) -> None:
        use = self._uses.get(api)
        if use is not None:
            use.calls += 1  # a lost increment under a race is acceptable; sites are not
            return
        site = _call_site(sys._getframe(1))
        with self._lock:
            use = self._uses.get(api)
            if use is None:
                self._uses[api] = ApiUse(api, action, 1, site)
            else:
                use.calls += 1

    def uses(self) -> list[ApiUse]:
        with self._lock:
            return sorted(self._uses.values(), key=lambda u: (-u.calls, u.api))

    def clear(self) -> None:
        with self._lock:
            self._uses.clear()


_recorder: UsageRecorder | None = None


def active_recorder() -> UsageRecorder | None:
    """The recorder replacements should call, or None when reporting is off."""
    return _recorder


def note(api: str, action: str = "translated") -> None:
    """Record one use of ``api`` if reporting is on (for cold paths; hot paths bind the recorder)."""
    recorder = _recorder
    if recorder is not None:
        recorder.hit(api, action)


def set_recorder(recorder: UsageRecorder | None) -> None:
    global _recorder
    _recorder = recorder
