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
    "device": "ascend_patch.adaptors.device_plugin",
    "comm": "ascend_patch.comm.plugin",
    "models": "ascend_patch.models.plugin",
    "ops": "ascend_patch.ops.plugin",
    "loaders": "ascend_patch.loaders.plugin",
    "megatron": "ascend_patch.adaptors.megatron.plugin",
    "megatron_training": "ascend_patch.adaptors.megatron_training.plugin",
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
                  **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call ``hook`` on each plugin in registration order, yielding (plugin name, result).

        Calling plugins one by one (rather than pluggy's all-at-once call) tells which
        plugin produced what, and lets a plugin that raises be recorded in
        :attr:`failures` and skipped while the others still run. ``on_plugin`` is told
        each plugin's name before its hook runs.
        """
        caller = getattr(self.pm.hook, hook)
        for impl in reversed(caller.get_hookimpls()):  # pluggy keeps them last-registered-first
            wanted = {k: v for k, v in kwargs.items() if k in impl.argnames}
            if on_plugin is not None:
                on_plugin(impl.plugin_name)
            try:
                result = impl.function(**wanted)
            except Exception as exc:
                self.failures.append(PluginFailure(
                    impl.plugin_name, self.origins.get(impl.plugin_name, ""), hook,
                    f"{type(exc).__name__}: {exc}"))
                continue
            yield impl.plugin_name, result

    def names(self) -> list[str]:
        return [name for name, plugin in self.pm.list_name_plugin() if plugin is not None]  # None: blocked


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
