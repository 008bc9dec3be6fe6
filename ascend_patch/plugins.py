"""The plugin manager: built-in plugins, entry-point plugins, and per-plugin failure isolation.

Built-ins are registered exactly like third-party plugins (by module, under a
name). Third-party plugins come from the entry-point group ``ascend_patch``; one
that fails to import is recorded with its distribution name and never stops the
others. ``ASCEND_PATCH_DISABLE_PLUGINS=name,...`` blocks plugins by name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pluggy
from pluggy import HookImpl

from .hookspec import PROJECT, AscendPatchSpec

__all__ = [
    "BUILTIN_PLUGINS",
    "PluginFailure",
    "PluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
]

# name -> module. Each module holds hookimpls only and imports nothing heavy at import.
BUILTIN_PLUGINS: dict[str, str] = {
    "device": "ascend_patch.adaptors.device.plugin",
    "comm": "ascend_patch.comm.plugin",
    "models": "ascend_patch.models.plugin",
    "ops": "ascend_patch.ops.plugin",
    "loaders": "ascend_patch.loaders.plugin",
    "megatron": "ascend_patch.adaptors.megatron.plugin",
    "megatron_training": "ascend_patch.adaptors.megatron.training.plugin",
    "migrate": "ascend_patch.migrate.plugin",
    "processes": "ascend_patch.patching.plugin",
}


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose hook raised."""

    plugin: str
    distribution: str
    stage: str  # "load" or the hook name
    error: str

    def __str__(self) -> str:
        dist = f" (distribution {self.distribution})" if self.distribution else ""
        return f"plugin {self.plugin!r}{dist} failed in {self.stage}: {self.error}"


class PluginManager:
    """pluggy's manager plus the bookkeeping ascend_patch needs (origins, failures)."""

    def __init__(self, disabled: Iterable[str] = (), entry_points: bool = True, builtins: bool = True) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(AscendPatchSpec)
        self.failures: list[PluginFailure] = []
        self.origins: dict[str, str] = {}  # plugin name -> "builtin" or distribution name
        self.disabled = tuple(disabled)
        for name in self.disabled:
            self.pm.set_blocked(name)
        for name, module in (BUILTIN_PLUGINS.items() if builtins else ()):
            if name in self.disabled:
                continue
            self.register(importlib.import_module(module), name, origin="builtin")
        if entry_points:
            self.load_entry_points()

    def register(self, plugin: Any, name: str, origin: str = "") -> None:
        """Register ``plugin`` under ``name``; a taken name raises naming both sides."""
        if name in self.disabled:
            return
        existing = self.pm.get_plugin(name)
        if existing is not None:
            raise ValueError(
                f"plugin name {name!r} is taken by {self.origins.get(name, '?')}; "
                f"{origin or 'the new plugin'} must use another name"
            )
        self.pm.register(plugin, name=name)
        self.origins[name] = origin or getattr(plugin, "__name__", repr(plugin))

    def unregister(self, name: str) -> None:
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin, name=name)
        self.origins.pop(name, None)

    def load_entry_points(self) -> None:
        """Load every ``ascend_patch`` entry point, isolating failures."""
        for ep in importlib.metadata.entry_points(group=PROJECT):
            dist = ep.dist.name if ep.dist is not None else ""
            if ep.name in self.disabled or self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
                self.register(plugin, ep.name, origin=dist or ep.value)
            except Exception as exc:
                failure = PluginFailure(ep.name, dist, "load", f"{type(exc).__name__}: {exc}")
                self.failures.append(failure)
                warnings.warn(f"ascend_patch: {failure}; the other plugins are unaffected", stacklevel=2)

    def call_each(self, hook: str, on_plugin: Callable[[str], None] | None = None,
                  **kwargs: object) -> Iterator[tuple[str, Any]]:
        """Call ``hook`` on each plugin in pluggy's order, yielding (plugin name, result).

        Every call goes through pluggy (a subset hook caller holding one plugin and the
        wrappers), so ``@hookimpl(wrapper=True)`` and old-style hookwrappers wrap each
        plugin's call, and ``pm.add_hookcall_monitoring`` tracers see every call. One call
        per plugin tells which plugin produced what, and a hook that raises is recorded in
        :attr:`failures` under the plugin whose code raised (a wrapper that raises is then
        left out of the remaining calls) while the others still run. A plugin returning
        None yields nothing; a wrapper may change or drop a plugin's results. ``on_plugin``
        is told each plugin's name before its hook runs.
        """
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        wrappers = [impl for impl in impls if _is_wrapper(impl)]
        broken: set[str] = set()
        for impl in reversed(impls):  # pluggy calls the last registered (and tryfirst) first
            if _is_wrapper(impl):
                continue
            left_out = [other.plugin for other in impls
                        if (other is not impl and not _is_wrapper(other)) or other.plugin_name in broken]
            if on_plugin is not None:
                on_plugin(impl.plugin_name)
            try:
                results = self.pm.subset_hook_caller(hook, left_out)(**kwargs)
            except Exception as exc:
                culprit = _culprit(exc, [impl, *(w for w in wrappers if w.plugin_name not in broken)]) or impl
                if culprit is not impl:
                    broken.add(culprit.plugin_name)
                self.failures.append(PluginFailure(
                    culprit.plugin_name, self.origins.get(culprit.plugin_name, ""), hook,
                    f"{type(exc).__name__}: {exc}"))
                continue
            for result in results:
                yield impl.plugin_name, result

    def record_failure(self, plugin: str, stage: str, exc: BaseException) -> None:
        """Record that ``plugin`` failed in ``stage`` (e.g. what its hook returned could not be used)."""
        self.failures.append(PluginFailure(plugin, self.origins.get(plugin, ""), stage, f"{type(exc).__name__}: {exc}"))

    def names(self) -> list[str]:
        return [name for name, plugin in self.pm.list_name_plugin() if plugin is not None]  # None: blocked


def _is_wrapper(impl: HookImpl) -> bool:
    return bool(impl.wrapper or impl.hookwrapper)


def _culprit(exc: BaseException, candidates: list[HookImpl]) -> HookImpl | None:
    """The hook implementation whose frame is deepest in ``exc``'s traceback (the one that raised).

    A plugin's exception passes through the wrappers around it (pluggy throws it into
    them), so the deepest implementation frame is the plugin's; an exception a wrapper
    raises itself has no plugin frame below the wrapper's. Instances of one plugin class
    share their functions' code, so a method's frame is matched by its ``self`` too.
    """
    by_code: dict[Any, list[HookImpl]] = {}
    for impl in candidates:
        by_code.setdefault(getattr(impl.function, "__code__", None), []).append(impl)
    found = None
    tb = exc.__traceback__
    while tb is not None:
        same_code = by_code.get(tb.tb_frame.f_code)
        if same_code:
            owner = tb.tb_frame.f_locals.get("self")
            found = next((i for i in same_code if getattr(i.function, "__self__", None) is owner), same_code[0])
        tb = tb.tb_next
    return found


_lock = threading.Lock()
_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process's plugin manager, made on first use from the environment's settings."""
    global _manager
    with _lock:
        if _manager is None:
            from .config import read_settings

            _manager = PluginManager(disabled=read_settings().disable_plugins)
        return _manager


def reset_plugin_manager(manager: PluginManager | None = None) -> PluginManager | None:
    """Replace the process's plugin manager (tests); returns the previous one."""
    global _manager
    with _lock:
        previous, _manager = _manager, manager
        return previous
