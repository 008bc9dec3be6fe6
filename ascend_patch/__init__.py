"""ascend_patch: training code written for NVIDIA GPUs runs unchanged on Ascend NPUs (or the host).

``import ascend_patch`` applies the patch set with settings from the ``ASCEND_PATCH_*``
environment variables. It does not import torch itself: when torch is not imported
yet, the patches are applied the moment it is. Everything is reversible::

    import ascend_patch
    ascend_patch.remove()              # originals back, by identity
    with ascend_patch.patched(): ...   # scoped activation
    print(ascend_patch.report())       # what was applied, deferred, skipped; what was used
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .config import ConfigError, Settings, read_settings
from .shim import TorchFirst

if TYPE_CHECKING:
    from .patching.report import Report
    from .backend import Backend

__all__ = [
    "ConfigError",
    "Settings",
    "__version__",
    "active_backend",
    "apply",
    "is_cuda_like",
    "patched",
    "remove",
    "report",
]

__version__ = "0.1.0"


def apply(settings: Settings | None = None, backend: Backend | None = None) -> Report:
    """Apply the patch set (settings default to the environment). A second call changes nothing."""
    global _auto_pending
    _auto_pending = False
    TorchFirst.uninstall()
    from .patching.report import apply_and_report

    return apply_and_report(settings, backend)


def remove() -> None:
    """Undo every patch: each original is restored by identity, shim modules are removed."""
    global _auto_pending
    _auto_pending = False
    TorchFirst.uninstall()
    if "ascend_patch.patching.manager" in sys.modules:
        from .patching.manager import manager

        manager.remove()
    # what `import ascend_patch` carried over before any apply (the manager restored the rest)
    from .environ import process_environment

    process_environment().restore()


@contextlib.contextmanager
def patched(settings: Settings | None = None, backend: Backend | None = None) -> Iterator[Report]:
    """Patches active inside the block only (unless they were active before it)."""
    from .patching.manager import manager

    was_active = manager.active
    result = apply(settings, backend)
    try:
        yield result
    finally:
        if not was_active:
            remove()


def report() -> Report:
    """What was applied, deferred, skipped or failed, and (when recording) which CUDA APIs ran."""
    from .patching.manager import manager
    from .patching.report import build_report

    return build_report(manager)


def active_backend() -> Backend | None:
    """The target the process is patched for, or None when nothing is applied."""
    if "ascend_patch.patching.manager" not in sys.modules:
        return None
    from .patching.manager import manager

    return manager.backend if manager.active else None


def is_cuda_like(obj: Any) -> bool:
    """True for a CUDA device, or the target's device, or a tensor on either.

    Use it where code compares ``device.type == "cuda"``, which stays False for
    target devices (``torch.device`` itself is not patched).
    """
    device = getattr(obj, "device", obj)
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    if isinstance(kind, str):
        kind = kind.split(":")[0]
    backend = active_backend()
    return kind == "cuda" or (backend is not None and kind == backend.device_type)


# -- apply on import ------------------------------------------------------------------

_auto_pending = False


def _apply_when_torch_imported(_module: Any) -> None:
    if not _auto_pending:
        return
    frame = _own_import_in_progress()
    if frame is None:
        apply(_auto_settings)  # a target other than npu puts the early carry-over back
    else:
        _apply_when_frame_returns(frame)


def _own_import_in_progress() -> Any:
    """The outermost frame running the top level of an ``ascend_patch`` module still being imported.

    ``import ascend_patch.cpu_device`` (or ``python -m ascend_patch.<tool>``) as a process's first
    import makes that module import torch; applying then would need the half-built module.
    """
    outer = None
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "<module>" and name.startswith("ascend_patch."):
            spec = getattr(sys.modules.get(name), "__spec__", None)
            if getattr(spec, "_initializing", False):
                outer = frame
        frame = frame.f_back
    return outer


def _apply_when_frame_returns(target: Any) -> None:
    """Apply once ``target`` (a module's top level) returns: then every module apply needs is whole."""
    previous = sys.getprofile()

    def watch(frame: Any, event: str, arg: Any) -> None:
        if previous is not None:
            previous(frame, event, arg)
        if event == "return" and frame is target:
            sys.setprofile(previous)
            if _auto_pending:
                apply(_auto_settings)

    sys.setprofile(watch)


def cancel_auto_apply() -> None:
    """Undo the apply-on-import (the CLI's non-run commands use this before their work)."""
    global _auto_pending
    _auto_pending = False
    remove()


try:
    _auto_settings = read_settings()
except ConfigError as _error:
    from .autoload import stop_if_autoloading

    stop_if_autoloading(_error)  # ends the process when the autoload .pth file imported us
    raise
if _auto_settings.enabled:
    _auto_pending = True
    if "torch" in sys.modules:
        apply(_auto_settings)
    else:
        if _auto_settings.device != "cpu":
            # `import torch` autoloads torch_npu, whose runtime reads ASCEND_RT_VISIBLE_DEVICES at once:
            # carry CUDA_VISIBLE_DEVICES over now, in the process's environment transaction, which
            # apply() shares and restores if the target turns out not to be npu
            from .environ import carry_over_cuda_variables, process_environment

            carry_over_cuda_variables(process_environment())
        import wrapt

        wrapt.register_post_import_hook(_apply_when_torch_imported, "torch")
        TorchFirst.install()  # `import transformer_engine` before torch imports torch, then finds its shim
