"""Model families as plugins: one :class:`ModelSpec` per family, each declared in its own folder."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..registry import NamedRegistry, UnknownName, loose_key
from .hf_config import ConfigMismatch, ModelConfig
from .traits import MEGATRON_ARG_DEFAULTS, ArgsMatcher, Traits, megatron_arg

__all__ = [
    "ArgsMatcher",
    "MEGATRON_ARG_DEFAULTS",
    "ModelSpec",
    "SpecRegistry",
    "Traits",
    "UnknownSpec",
    "get_spec_registry",
    "lazy",
    "resolve_spec",
    "spec_for_hf_config",
]

# A family says everything about itself once: its names and the spellings users type
# (``--spec``, ``--model-type-hf``: ``qwen2.5`` is ``qwen2``), the Hugging Face model types
# and architectures it serves, the checkpoint-format names that imply it (``qwen3_hf``),
# how to recognise its Megatron checkpoints from their saved ``args``, its config map
# (both ways), the megatron-core layer spec and the weight map. Built-in families live
# in ``ascend_patch/models/<family>/``; third-party ones come from the
# ``ascend_patch_model_specs`` hook; nothing elsewhere knows a family by name.
#
# ``--spec qwen3`` resolves by name or alias; Megatron's two-word form
# ``--spec some.module layer_spec`` resolves to that module attribute. Unknown names list
# the known ones; a name claimed twice names both plugins.
_HINT = ("A plugin adds one by implementing ascend_patch_model_specs (entry-point group 'ascend_patch'); "
         "see docs/plugins.md")
class UnknownSpec(UnknownName):
    """A spec name nothing registered."""


def lazy(module: str, attr: str) -> Callable[..., Any]:
    """A callable importing ``module.attr`` on first use (a family's megatron-core layer spec, say)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = f"{module}.{attr}"
    return call


@dataclass(frozen=True)
class ModelSpec:
    """One model family.

    ``config_from_hf(config_dict) -> ModelConfig`` maps an HF ``config.json``;
    ``config_to_hf(model_config, dtype) -> dict`` writes one back (mg -> hf from a
    checkpoint that stores none). ``layer_spec(model_config) -> ModuleSpec`` builds the
    megatron-core layer spec (None for families that only convert); ``weight_map`` gives
    the declarative HF <-> Megatron weight map (None: the family does not convert).
    ``loader_aliases`` are checkpoint-format names that mean "this family's HF files"
    (``--loader qwen3_hf``); ``hf_format`` names the loader/saver that reads them when
    they are not the weight map's own tensors (Phi-3's fused ones), None when any HF
    format does. ``megatron_args`` scores a Megatron checkpoint's ``args`` (see
    :class:`ArgsMatcher`) to tell the family of a checkpoint Megatron-LM wrote; by default
    it is the one ``traits`` (:class:`Traits`) state.
    """

    name: str
    config_from_hf: Callable[[Mapping[str, Any]], ModelConfig]
    hf_model_types: tuple[str, ...] = ()
    hf_architectures: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    description: str = ""
    layer_spec: Callable[[ModelConfig], Any] | None = None
    weight_map: Callable[[ModelConfig], Any] | None = None
    config_to_hf: Callable[[ModelConfig, str], dict[str, Any]] | None = None
    loader_aliases: tuple[str, ...] = ()
    hf_format: str | None = None
    megatron_args: Callable[[Any], int] | None = None
    traits: Traits | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    owner: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.megatron_args is None and self.traits is not None:  # the family's facts, from its traits
            object.__setattr__(self, "megatron_args", self.traits.args_matcher())

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def converts(self) -> bool:
        """Whether the converter can move this family's checkpoints (it has a weight map)."""
        return self.weight_map is not None


class SpecRegistry:
    """All known specs, by name and alias (``Qwen2.5``, ``qwen2_5`` and ``qwen25`` are one name)."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._names: NamedRegistry[ModelSpec] = NamedRegistry("model spec", hint=_HINT, unknown=UnknownSpec,
                                                              key=loose_key)
        self._formats: NamedRegistry[ModelSpec] = NamedRegistry("checkpoint format")
        for spec in specs:
            self.add(spec)

    def add(self, spec: ModelSpec) -> None:
        self._names.add(spec, spec.name, spec.aliases, owner=spec.owner, label=f"spec {spec.name!r}")
        if spec.loader_aliases:
            self._formats.add(spec, spec.loader_aliases[0], spec.loader_aliases[1:], owner=spec.owner,
                              label=f"spec {spec.name!r}")

    def specs(self) -> list[ModelSpec]:
        return list(self._names)

    def known(self) -> list[str]:
        return self._names.names()

    def get(self, name: str) -> ModelSpec:
        return self._names.get(name)

    def find(self, name: str) -> ModelSpec | None:
        return self._names.find(name)

    def converting(self) -> list[str]:
        """The families the converter handles (those with a weight map)."""
        return [s.name for s in self.specs() if s.converts]

    def for_format_name(self, name: str) -> ModelSpec | None:
        """The family a checkpoint-format name implies (``qwen3_hf`` -> qwen3), if any."""
        return self._formats.find(name)

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

    def for_megatron_args(self, args: Any) -> ModelSpec:
        """The family whose :attr:`ModelSpec.megatron_args` matches a checkpoint's ``args`` most specifically."""
        scored = [(spec.megatron_args(args), spec) for spec in self.specs() if spec.megatron_args is not None]
        best = max((score for score, _ in scored), default=0)
        winners = [spec.name for score, spec in scored if score == best and score > 0]
        if len(winners) == 1:
            return self.get(winners[0])
        looked = sorted({n for s in self.specs() if isinstance(s.megatron_args, ArgsMatcher)
                         for n in s.megatron_args.names})
        said = ", ".join(f"{n}={megatron_arg(args, n)!r}" for n in looked)
        what = (f"matches the families {', '.join(winners)} equally" if winners
                else "matches no family's Megatron arguments")
        raise ConfigMismatch(f"the checkpoint's args ({said}) {what}; pass --model-type-hf "
                             f"({', '.join(self.known())})")


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
