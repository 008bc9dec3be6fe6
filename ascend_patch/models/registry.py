"""Model specs as plugins: name -> family (config mapping, megatron-core layer spec, weight map).

Specs come from the ``ascend_patch_model_specs`` hook, built-ins and third-party
alike. ``--spec qwen3`` resolves by name or alias; Megatron's two-word form
``--spec some.module layer_spec`` resolves to that module attribute. Unknown names
list the known ones; a name claimed twice names both plugins.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .hf_config import ModelConfig

__all__ = [
    "ModelSpec",
    "SpecRegistry",
    "UnknownSpec",
    "get_spec_registry",
    "resolve_spec",
    "spec_for_hf_config",
]


class UnknownSpec(LookupError):
    """A spec name nothing registered."""


@dataclass(frozen=True)
class ModelSpec:
    """One model family.

    ``config_from_hf(config_dict) -> ModelConfig`` maps an HF ``config.json``.
    ``layer_spec(model_config) -> ModuleSpec`` builds the megatron-core layer spec
    (None for families that only convert). ``weight_map(model_config)`` returns the
    declarative HF <-> Megatron weight map used by the converter.
    """

    name: str
    config_from_hf: Callable[[Mapping[str, Any]], ModelConfig]
    hf_model_types: tuple[str, ...] = ()
    hf_architectures: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    description: str = ""
    layer_spec: Callable[[ModelConfig], Any] | None = None
    weight_map: Callable[[ModelConfig], Any] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    owner: str = field(default="", compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


class SpecRegistry:
    """All known specs, by name and alias."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._by_name: dict[str, ModelSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ModelSpec) -> None:
        for name in spec.names:
            key = name.lower()
            existing = self._by_name.get(key)
            if existing is not None and existing is not spec:
                raise ValueError(
                    f"model spec name {name!r} is claimed by plugin {existing.owner or '?'} "
                    f"(spec {existing.name!r}) and by plugin {spec.owner or '?'} (spec {spec.name!r})")
            self._by_name[key] = spec

    def specs(self) -> list[ModelSpec]:
        seen: dict[int, ModelSpec] = {}
        for spec in self._by_name.values():
            seen.setdefault(id(spec), spec)
        return sorted(seen.values(), key=lambda s: s.name)

    def known(self) -> list[str]:
        return sorted(s.name for s in self.specs())

    def get(self, name: str) -> ModelSpec:
        spec = self._by_name.get(name.lower())
        if spec is None:
            raise UnknownSpec(
                f"unknown model spec {name!r}; known: {', '.join(self.known())}. A plugin adds one by "
                "implementing ascend_patch_model_specs (entry-point group 'ascend_patch'); see docs/plugins.md")
        return spec

    def for_hf_config(self, config: Mapping[str, Any]) -> ModelSpec:
        """The spec serving an HF config (by ``architectures`` first, then ``model_type``)."""
        for arch in config.get("architectures") or ():
            for spec in self.specs():
                if arch in spec.hf_architectures:
                    return spec
        model_type = config.get("model_type")
        for spec in self.specs():
            if model_type in spec.hf_model_types:
                return spec
        served = sorted({t for s in self.specs() for t in s.hf_model_types})
        raise UnknownSpec(f"no model spec serves model_type {model_type!r} "
                          f"(architectures {list(config.get('architectures') or [])}); "
                          f"served model types: {', '.join(served)}; pass --spec NAME to choose one")


_registry: SpecRegistry | None = None


def get_spec_registry(refresh: bool = False) -> SpecRegistry:
    """The registry built from every plugin's ``ascend_patch_model_specs``."""
    global _registry
    if _registry is None or refresh:
        import dataclasses

        from ..plugins import get_plugin_manager

        registry = SpecRegistry()
        for plugin, specs in get_plugin_manager().call_each("ascend_patch_model_specs"):
            for spec in specs or ():
                registry.add(dataclasses.replace(spec, owner=spec.owner or plugin))
        _registry = registry
    return _registry


def resolve_spec(spec: str | Sequence[str]) -> Any:
    """``--spec NAME`` -> ModelSpec; ``--spec module attr`` -> that attribute (Megatron's form)."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    if len(parts) == 1 and " " in parts[0].strip():
        parts = parts[0].split()
    if len(parts) == 1:
        return get_spec_registry().get(parts[0])
    if len(parts) != 2:
        raise UnknownSpec(f"--spec takes a name or 'module attribute', got {' '.join(parts)!r}")
    module_name, attr = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownSpec(f"--spec {module_name} {attr}: cannot import {module_name} ({exc})") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownSpec(f"--spec {module_name} {attr}: {module_name} has no attribute {attr!r}") from None


def spec_for_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    return get_spec_registry().for_hf_config(config)
