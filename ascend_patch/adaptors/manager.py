"""The patch manager: applies Patch records, defers them, undoes them exactly.

* Targets are resolved without importing anything: a patch whose module is not
  imported yet waits for it through a wrapt post-import hook.
* Every change is on an undo stack; :meth:`PatchManager.remove` restores each
  original by identity (deleting attributes that were only inherited), removes shim
  modules, restores environment variables and re-binds copies back.
* By-value copies of an original (``from torch.cuda import current_device`` made
  before patching) are re-bound in every imported module, and the status says where.
* A missing target or a package version out of range is recorded as skipped with
  the reason, a plugin whose hook raises is reported and the others still apply (both
  fatal with ``ASCEND_PATCH_STRICT=1``); two patches claiming one target
  raise :class:`PatchConflict` naming both.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import threading
import types
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import wrapt

from ..backend import Backend, Selection, select_backend
from ..config import Settings, read_settings
from ..environ import EnvTransaction, process_environment
from ..patch import Patch, PatchKind
from .. import usage
from .shims import ShimFinder
from .versions import clear_version_cache, version_problem

__all__ = [
    "PatchConflict",
    "PatchError",
    "PatchManager",
    "PatchRegistry",
    "PatchStatus",
    "manager",
]

_MISSING = object()
# id -> every replacement currently installed (kept alive so ids stay unique); a value
# found here at its target is ours already, which is what stops double wrapping.
_LIVE: dict[int, Any] = {}


class PatchError(RuntimeError):
    """A patch could not be applied and ``ASCEND_PATCH_STRICT=1`` makes that fatal."""


class PatchConflict(RuntimeError):
    """Two patches claim the same target."""


class PatchRegistry:
    """What plugins add their patches to, in ``ascend_patch_register_patches``."""

    def __init__(self, backend: Backend, settings: Settings | None = None) -> None:
        self.backend = backend
        self.settings = settings if settings is not None else Settings()
        self.owner = ""
        self._patches: dict[str, Patch] = {}
        self.conflicts: list[str] = []

    def add(self, patch: Patch) -> None:
        """Add one patch; ignored when it is not for this target."""
        if self.backend.name not in patch.backends:
            return
        if not patch.owner:
            patch = dataclasses.replace(patch, owner=self.owner)
        existing = self._patches.get(patch.target)
        if existing is not None:
            self.conflicts.append(
                f"two patches claim {patch.target}: plugin {existing.owner!r} ({existing.reason}) "
                f"and plugin {patch.owner!r} ({patch.reason}); disable one with "
                "ASCEND_PATCH_DISABLE_PLUGINS")
            return
        self._patches[patch.target] = patch

    def extend(self, patches: Iterable[Patch]) -> None:
        for patch in patches:
            self.add(patch)

    def patches(self) -> list[Patch]:
        return list(self._patches.values())


@dataclass
class PatchStatus:
    """Where one patch stands: applied, deferred (waiting for an import), skipped or failed."""

    patch: Patch
    state: str
    detail: str = ""
    rebound: list[str] = field(default_factory=list)


@dataclass
class _Undo:
    status: PatchStatus
    owner: Any
    name: str
    had_own: bool
    old: Any  # the owner's own value before (when had_own)
    original: Any  # what getattr returned before (for re-binding copies back)
    new: Any
    rebound: list[tuple[dict[str, Any], str]] = field(default_factory=list)


_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes)


def _has_identity(obj: Any) -> bool:
    """Whether "the same object" means "a copy of this attribute": true for functions, classes,
    descriptors and modules only. Plain values (None, numbers, strings, and containers such as
    the empty tuple, which Python shares between unrelated places) say nothing about where they
    came from; re-binding every ``()`` in every module would be a disaster."""
    if isinstance(obj, _VALUE_TYPES):
        return False
    return callable(obj) or isinstance(obj, (property, staticmethod, classmethod, types.ModuleType))


def _resolve(module: Any, path: str) -> tuple[Any, str, Any]:
    owner = module
    parts = path.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1], getattr(owner, parts[-1], _MISSING)


def _own_dict(owner: Any) -> dict[str, Any] | Any:
    try:
        return vars(owner)
    except TypeError:
        return {}


class PatchManager:
    """Applies and removes the patch set of one process. Use the module's :data:`manager`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.active = False
        self.settings: Settings | None = None
        self.backend: Backend | None = None
        self.selection: Selection | None = None
        self.statuses: list[PatchStatus] = []
        self._undo: list[_Undo] = []
        self._deferred: dict[str, list[PatchStatus]] = {}
        self._hooked: set[str] = set()
        # every variable import, selection and EnvVar patches set; remove() restores it
        self.env: EnvTransaction = process_environment()
        self._shims = ShimFinder()
        self.recorder: usage.UsageRecorder | None = None
        self.plugin_failures: list[str] = []
        self.generation = 0

    # -- apply --------------------------------------------------------------------------

    def apply(self, settings: Settings | None = None, backend: Backend | None = None) -> PatchManager:
        """Apply every plugin's patches for the chosen target. A second call changes nothing.

        With different ``settings`` or an explicit ``backend`` while active, the current
        patch set is removed first and the new one applied.
        """
        with self._lock:
            if self.active:
                if backend is None and (settings is None or settings == self.settings):
                    return self
                self.remove()
            settings = settings if settings is not None else read_settings()
            self.settings = settings
            clear_version_cache()  # packages may have been installed or upgraded since
            self.recorder = None
            if backend is None:
                self.selection = select_backend(settings, self.env)
            else:
                self.selection = Selection(backend, backend.reason or f"given backend {backend.name}", self.env)
            self.backend = self.selection.backend
            if self.backend is None or self.backend.name != "npu":
                self.env.restore()  # the NPU runtime variables `import ascend_patch` carried over early
            self.statuses, self.plugin_failures = [], []  # nothing of an earlier apply's table
            if self.backend is None:
                if settings.enabled and settings.device == "auto":
                    warnings.warn(f"ascend_patch: {self.selection.reason}", stacklevel=3)
                return self
            self.recorder = usage.UsageRecorder() if settings.report_enabled else None
            usage.set_recorder(self.recorder)
            try:
                patches = self._collect(self.backend)
            except Exception:
                usage.set_recorder(None)
                self.recorder, self.backend = None, None
                self.env.restore()
                raise
            self.active = True
            self.generation += 1
            self.statuses = [PatchStatus(p, "pending") for p in patches]
            ready: list[PatchStatus] = []
            for status in self.statuses:
                kind = status.patch.kind
                if kind is PatchKind.ENV:
                    self._apply_env(status)
                elif kind is PatchKind.MODULE:
                    self._add_shim(status)
                elif status.patch.module in sys.modules:
                    ready.append(status)
                else:
                    self._defer(status)
            self._apply_now(ready)
            if self._shims.names():
                self._shims.install()
            return self

    def _collect(self, backend: Backend) -> list[Patch]:
        from ..plugins import get_plugin_manager

        pm = get_plugin_manager()
        registry = PatchRegistry(backend, self.settings)
        start = len(pm.failures)

        def set_owner(name: str) -> None:
            registry.owner = name

        for _ in pm.call_each("ascend_patch_register_patches", on_plugin=set_owner,
                              registry=registry, backend=backend):
            pass
        # plugins that failed to load, and hooks that failed in this apply (not an earlier one's)
        failures = [f for f in pm.failures[:start] if f.stage == "load"] + pm.failures[start:]
        self.plugin_failures = [str(f) for f in failures]
        if failures and self.settings is not None and self.settings.strict:
            raise PatchError("; ".join(self.plugin_failures) + " (ASCEND_PATCH_STRICT=1 makes a plugin "
                             "failure fatal; without it the other plugins' patches apply)")
        for failure in pm.failures[start:]:
            warnings.warn(f"ascend_patch: {failure}", stacklevel=4)
        if registry.conflicts:
            raise PatchConflict("; ".join(registry.conflicts))
        return registry.patches()

    def _skip(self, status: PatchStatus, why: str, state: str = "skipped") -> None:
        status.state, status.detail = state, why
        if self.settings is not None and self.settings.strict:
            raise PatchError(f"{status.patch.shown_as}: {why} (ASCEND_PATCH_STRICT=1 makes this fatal)")

    def _apply_now(self, statuses: list[PatchStatus]) -> None:
        applied: list[_Undo] = []
        for status in statuses:
            undo = self._apply_one(status)
            if undo is not None:
                applied.append(undo)
        self._rebind(applied)

    def _apply_one(self, status: PatchStatus) -> _Undo | None:
        patch = status.patch
        problem = version_problem(patch)
        if problem:
            self._skip(status, problem)
            return None
        module = sys.modules.get(patch.module)
        try:
            owner, name, current = _resolve(module, patch.attribute)
        except AttributeError as exc:
            self._skip(status, f"target missing: {exc}")
            return None
        if patch.kind is PatchKind.ADD:
            if current is not _MISSING:
                status.state, status.detail = "skipped", "already provided by the target"
                return None
        elif current is _MISSING:
            self._skip(status, f"target missing: {patch.module} has no {patch.attribute}")
            return None
        if current is not _MISSING and _has_identity(current) and id(current) in _LIVE:
            status.state, status.detail = "skipped", "already patched (no double wrapping)"
            return None
        own = _own_dict(owner)
        had_own = name in own
        old = own.get(name, _MISSING) if had_own else _MISSING
        try:
            if patch.kind is PatchKind.WRAP:
                new = wrapt.FunctionWrapper(old if had_own else current, patch.wrapper)
            else:
                new = patch.build(None if current is _MISSING else current)
            new = self._count(patch, new)
            setattr(owner, name, new)
        except Exception as exc:
            self._skip(status, f"failed: {type(exc).__name__}: {exc}", state="failed")
            return None
        status.state, status.detail = "applied", ""
        undo = _Undo(status, owner, name, had_own, old, current, new)
        self._undo.append(undo)
        if _has_identity(new):
            _LIVE[id(new)] = new
        return undo

    def _count(self, patch: Patch, new: Any) -> Any:
        """With reporting on, make calls of ``new`` count as uses of the patched CUDA API."""
        recorder = self.recorder
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

            def counted(*args: Any, **kwargs: Any) -> Any:
                recorder.hit(api, action)
                return target(*args, **kwargs)

            counted.__name__ = getattr(new, "__name__", "counted")
            counted.__doc__ = getattr(new, "__doc__", None)
            counted.__wrapped__ = new  # type: ignore[attr-defined]
            return counted
        return new

    def _rebind(self, applied: list[_Undo]) -> None:
        """Point by-value copies of each original (in every imported module) at the new value."""
        originals = {id(u.original): u for u in applied
                     if u.original is not _MISSING and _rebindable(u, u.original)}
        if not originals:
            return
        for mod_name, d in _module_dicts():
            # set arithmetic in C first: most modules hold none of the originals
            if originals.keys().isdisjoint(map(id, d.values())):
                continue
            for key, value in list(d.items()):
                undo = originals.get(id(value))
                if undo is None or value is not undo.original or d is _own_dict(undo.owner):
                    continue
                d[key] = undo.new
                undo.rebound.append((d, key))
                undo.status.rebound.append(f"{mod_name}.{key}")

    def _defer(self, status: PatchStatus) -> None:
        name = status.patch.module
        status.state, status.detail = "deferred", f"waiting for import of {name}"
        self._deferred.setdefault(name, []).append(status)
        if name not in self._hooked:
            self._hooked.add(name)
            wrapt.register_post_import_hook(_on_import, name)

    def on_import(self, module_name: str) -> None:
        with self._lock:
            if not self.active:
                return
            waiting = self._deferred.pop(module_name, [])
            if waiting:
                self._apply_now(waiting)

    def _apply_env(self, status: PatchStatus) -> None:
        name = status.patch.target
        if name in self.env:  # carried over by `import ascend_patch` or backend selection
            status.state = "applied"
            status.detail = f"{name}={os.environ.get(name)} (set before torch_npu was imported)"
            return
        before = os.environ.get(name)
        value = status.patch.build(before)
        if value is None or value == before:
            status.state, status.detail = "skipped", "nothing to set"
            return
        self.env.set(name, value)
        status.state, status.detail = "applied", f"{name}={value}"

    def _add_shim(self, status: PatchStatus) -> None:
        name = status.patch.target
        top = name.split(".")[0]
        loaded = sys.modules.get(top)
        if loaded is not None:
            real = not _is_our_shim(loaded)
        else:
            try:
                real = importlib.util.find_spec(top) is not None  # our finder is not on meta_path yet
            except (ImportError, ValueError):
                real = False
        if real:
            status.state, status.detail = "skipped", f"{top} is installed; the real package is used"
            return
        self._shims.add(name, status.patch.build, status.patch.hidden_from)
        status.state, status.detail = "applied", f"shim served while {top} is not installed"

    # -- remove -------------------------------------------------------------------------

    def remove(self) -> None:
        """Undo everything ``apply`` did, restoring each original by identity."""
        with self._lock:
            if not self.active:
                return
            replaced = {id(u.new): u for u in self._undo if _rebindable(u, u.new)}
            for undo in reversed(self._undo):
                own = _own_dict(undo.owner)
                if own.get(undo.name, _MISSING) is undo.new:
                    if undo.had_own:
                        setattr(undo.owner, undo.name, undo.old)
                    else:
                        delattr(undo.owner, undo.name)
                for d, key in undo.rebound:
                    if d.get(key) is undo.new:
                        d[key] = undo.original
            # copies of a replacement made after apply (modules imported while patched)
            if replaced:
                for _, d in _module_dicts():
                    if replaced.keys().isdisjoint(map(id, d.values())):
                        continue
                    for key, value in list(d.items()):
                        undo = replaced.get(id(value))
                        # an ADD patch had no original: a copy of what it added is left as it is
                        if (undo is not None and value is undo.new and d is not _own_dict(undo.owner)
                                and undo.original is not _MISSING):
                            d[key] = undo.original
            self._undo.clear()
            _LIVE.clear()
            self.env.restore()
            self._shims.uninstall()
            self._shims = ShimFinder()
            _drop_wrapt_hooks(self._deferred)
            self._deferred.clear()
            self._hooked.clear()
            for status in self.statuses:
                if status.state in ("applied", "deferred"):
                    status.state, status.detail = "removed", ""
            usage.set_recorder(None)
            self.active = False
            self.backend = None

    # -- queries ------------------------------------------------------------------------

    def status_of(self, target: str) -> PatchStatus | None:
        for status in self.statuses:
            if status.patch.target == target:
                return status
        return None


# Values whose identity says nothing about where they came from: None, True, 0, "cuda" are
# shared by every module holding that value, so they are never "copies" of one attribute.
def _rebindable(undo: _Undo, value: Any) -> bool:
    return undo.status.patch.rebind and _has_identity(value)


def _module_dicts() -> list[tuple[str, dict[str, Any]]]:
    """(name, namespace) of every imported module but ours."""
    out = []
    for name, module in list(sys.modules.items()):
        if module is None or name.startswith("ascend_patch"):
            continue
        d = getattr(module, "__dict__", None)
        if isinstance(d, dict):
            out.append((name, d))
    return out


def _is_our_shim(obj: Any) -> bool:
    from .shims import is_shim

    return is_shim(obj)


def _drop_wrapt_hooks(deferred: dict[str, list[PatchStatus]]) -> None:
    """Take our callbacks off wrapt's pending list so nothing of ours fires after remove()."""
    hooks = getattr(getattr(wrapt, "importer", None), "_post_import_hooks", None)
    if not isinstance(hooks, dict):
        return
    for name in list(hooks):
        callbacks = hooks.get(name)
        if isinstance(callbacks, list) and _on_import in callbacks:
            callbacks[:] = [c for c in callbacks if c is not _on_import]
            if not callbacks:
                del hooks[name]


def _on_import(module: Any) -> None:
    manager.on_import(module.__name__)


manager = PatchManager()
