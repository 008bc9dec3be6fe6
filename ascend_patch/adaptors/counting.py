"""Replacements that count their calls as uses of the CUDA API they stand for (reporting on only).

With reporting off nothing here runs: the replacement is installed as it is, so the hot
path pays nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from ..patch import AttributePatch
from ..usage import UsageRecorder

__all__ = ["counted"]


def counted(patch: AttributePatch, new: Any, recorder: UsageRecorder | None) -> Any:
    """``new``, made to record each call with ``recorder`` (``new`` itself when there is nothing to count)."""
    if recorder is None or not patch.count_calls:
        return new
    api, action = patch.shown_as, patch.action.value
    if isinstance(new, type):
        init = new.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            recorder.hit(api, action)
            init(self, *args, **kwargs)

        return type(new.__name__, (new,), {"__init__": __init__, "__module__": new.__module__,
                                           "__qualname__": new.__qualname__})
    if isinstance(new, property) and new.fget is not None:
        fget = new.fget

        def counted_get(self: Any) -> Any:
            recorder.hit(api, action)
            return fget(self)

        return property(counted_get, new.fset, new.fdel, new.__doc__)
    if callable(new) and not isinstance(new, (staticmethod, classmethod)):
        target = new

        # name, docstring and __wrapped__ of the replacement, nothing else (its __dict__ may hold
        # markers such as torch.compile's, which must not move onto the counting wrapper)
        @functools.wraps(new, assigned=("__name__", "__doc__"), updated=())
        def counted_call(*args: Any, **kwargs: Any) -> Any:
            recorder.hit(api, action)
            return target(*args, **kwargs)

        if not hasattr(new, "__name__"):
            counted_call.__name__ = "counted"
        return counted_call
    return new
