"""The patch manager: collects patch records from the plugins, applies, defers and undoes them."""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import wrapt

from ..backend import Backend, Selection, select_backend, set_active_backend
from ..config import Settings, read_settings
from ..environ import EnvTransaction, process_environment
from ..hookspec import Target
from ..patch import Patch, Wrap
from ..usage import UsageRecorder, set_recorder
from .appliers import Applier, applier_for
from .status import ApplyContext, PatchError, PatchStatus, skip
from .versions import clear_version_cache, version_problem
from ..errors import AscendPatchError

__all__ = [
    "PatchConflict",
    "PatchError",
    "PatchManager",
    "PatchRegistry",
    "PatchStatus",
    "collect",
    "manager",
]


class PatchConflict(AscendPatchError, RuntimeError):
    """Two patches claim the same target."""


class PatchRegistry:
    """The patches of one apply, by target; satisfies :class:`ascend_patch.hookspec.PatchSink`.

    ``owner`` is the plugin whose hook is running; a patch without an owner gets it. Wraps
    of one target compose in the order they are added (the first is innermost); any other
    pair claiming one target is recorded in :attr:`conflicts`, naming both plugins.
    """

    def __init__(self, backend: Target, settings: Settings | None = None) -> None:
        self.backend = backend
        self.settings = settings if settings is not None else Settings()
        self.owner = ""
        self._patches: dict[str, list[Patch]] = {}
        self.conflicts: list[str] = []

    def add(self, patch: Patch) -> None:
        """Add one patch; ignored when it is not for this target. A record no applier knows raises."""
        applier_for(patch)  # TypeError now, in the plugin's hook (recorded as its failure), not at apply
        if self.backend.name not in patch.backends:
            return
        if not patch.owner:
            patch = dataclasses.replace(patch, owner=self.owner)
        claimed = self._patches.setdefault(patch.target, [])
        if claimed and not (isinstance(patch, Wrap) and all(isinstance(p, Wrap) for p in claimed)):
            existing = claimed[0]
            self.conflicts.append(
                f"two patches claim {patch.target}: plugin {existing.owner!r} ({existing.reason}) "
                f"and plugin {patch.owner!r} ({patch.reason}); only wraps compose; disable one with "
                "ASCEND_PATCH_DISABLE_PLUGINS")
            return
        claimed.append(patch)

    def extend(self, patches: Iterable[Patch]) -> None:
        """Add each of ``patches``."""
        for patch in patches:
            self.add(patch)

    def patches(self) -> list[Patch]:
        """Every patch, a target's wraps innermost first."""
        return [patch for claimed in self._patches.values() for patch in claimed]


def collect(registry: PatchRegistry, pm: Any) -> None:
    """Every plugin's patches for ``registry.backend`` into ``registry``, each owned by its plugin."""

    def set_owner(name: str) -> None:
        registry.owner = name

    for name, patches in pm.call_each("ascend_patch_register_patches", on_plugin=set_owner,
                                      backend=registry.backend, settings=registry.settings, registry=registry):
        registry.owner = name
        try:
            registry.extend(list(patches))
        except Exception as exc:  # a generator that raised, or a return value that is not a list of patches
            pm.record_failure(name, "ascend_patch_register_patches", exc)


class PatchManager:
    """Applies and removes the patch set of one process. Use the module's :data:`manager`.

    * Each record type has its applier (``appliers.py``): attribute patches (Replace, Add,
      Wrap) wait for their module's import, shims and environment variables apply at once.
    * Targets are resolved without importing anything: a patch whose module is not
      imported yet waits for it through a wrapt post-import hook.
    * Every change is an undo entry; :meth:`remove` restores each original by identity
      (deleting attributes that were only inherited), removes shim modules, restores the
      environment transaction and re-binds copies back.
    * By-value copies of an original (``from torch.cuda import current_device`` made
      before patching) are re-bound in every imported module, and the status says where.
    * A missing target or a package version out of range is recorded as skipped with
      the reason, a plugin whose hook raises is reported and the others still apply (both
      fatal with ``ASCEND_PATCH_STRICT=1``); a conflict raises :class:`PatchConflict`.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.active = False
        self.settings: Settings | None = None
        self.backend: Backend | None = None
        self.selection: Selection | None = None
        self.statuses: list[PatchStatus] = []
        self._undo: list[tuple[Applier, Any]] = []  # (applier, undo entry), oldest first
        self._deferred: dict[str, list[PatchStatus]] = {}
        # every variable import, selection and EnvVar patches set; remove() restores it
        self.env: EnvTransaction = process_environment()
        self.recorder: UsageRecorder | None = None
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
            self.recorder = UsageRecorder() if settings.report_enabled else None
            set_recorder(self.recorder)
            try:
                patches = self._collect(self.backend)
            except Exception:
                set_recorder(None)
                self.recorder, self.backend = None, None
                self.env.restore()
                raise
            self.active = True
            set_active_backend(self.backend)
            self.generation += 1
            self.statuses = [PatchStatus(p, "pending") for p in patches]
            ready: list[PatchStatus] = []
            for status in self.statuses:
                module = applier_for(status.patch).waits_for(status.patch)
                if module is None:
                    ready.append(status)
                else:
                    self._defer(status, module)
            self._apply_now(ready)
            return self

    def _collect(self, backend: Backend) -> list[Patch]:
        from ..plugins import get_plugin_manager

        pm = get_plugin_manager()
        registry = PatchRegistry(backend, self.settings)
        start = len(pm.failures)
        collect(registry, pm)
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

    def _apply_now(self, statuses: list[PatchStatus]) -> None:
        """Check versions, then hand each applier its patches (in one batch, for one re-binding pass)."""
        ctx = ApplyContext(strict=self.settings is not None and self.settings.strict,
                           recorder=self.recorder, env=self.env)
        batches: dict[int, tuple[Applier, list[PatchStatus]]] = {}
        for status in statuses:
            problem = version_problem(status.patch)
            if problem:
                skip(status, problem[0], ctx.strict and problem[1])
                continue
            applier = applier_for(status.patch)
            batches.setdefault(id(applier), (applier, []))[1].append(status)
        for applier, batch in batches.values():
            self._undo.extend((applier, entry) for entry in applier.apply(batch, ctx))

    def _defer(self, status: PatchStatus, module: str) -> None:
        status.state, status.detail = "deferred", f"waiting for import of {module}"
        self._deferred.setdefault(module, []).append(status)
        _watch(module)

    def on_import(self, module_name: str) -> None:
        with self._lock:
            if not self.active:
                return
            waiting = self._deferred.pop(module_name, [])
            if waiting:
                self._apply_now(waiting)

    # -- remove -------------------------------------------------------------------------

    def remove(self) -> None:
        """Undo everything ``apply`` did, restoring each original by identity."""
        with self._lock:
            if not self.active:
                return
            # each applier undoes its own entries, newest first; the last applier used goes first
            by_applier: dict[int, tuple[Applier, list[Any]]] = {}
            for applier, entry in reversed(self._undo):
                by_applier.setdefault(id(applier), (applier, []))[1].append(entry)
            for applier, entries in by_applier.values():
                applier.undo(entries)
            self._undo.clear()
            self.env.restore()
            self._deferred.clear()  # their post-import hooks find nothing waiting
            for status in self.statuses:
                if status.state in ("applied", "deferred"):
                    status.state, status.detail = "removed", ""
            set_recorder(None)
            self.active = False
            self.backend = None
            set_active_backend(None)

    # -- queries ------------------------------------------------------------------------

    def status_of(self, target: str) -> PatchStatus | None:
        for status in self.statuses:
            if status.patch.target == target:
                return status
        return None


# Modules our post-import hook is registered for and has not fired for yet: our own record
# (wrapt keeps its list private), so a module is watched once however often apply() runs.
# The hook asks the manager, which ignores a module nothing waits for (after remove()).
_watched: set[str] = set()
_watched_lock = threading.Lock()


def _watch(module: str) -> None:
    with _watched_lock:
        if module in _watched:
            return
        _watched.add(module)
    wrapt.register_post_import_hook(_on_import, module)


def _on_import(module: Any) -> None:
    with _watched_lock:
        _watched.discard(module.__name__)
    manager.on_import(module.__name__)


manager = PatchManager()
