"""Which model family a checkpoint is: ``--model-type-hf``, the HF config, or a hint (a format alias, the args)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Finding
from ..models.hf_config import ConfigMismatch, ModelConfig
from ..models.registry import ModelSpec, get_spec_registry
from ..models.weightmap import WeightMap
from .formats import ConvertOptions

__all__ = ["resolve_family", "weight_map_for"]


# Every name, alias and hint comes from the family specs (:mod:`ascend_patch.models.registry`):
# nothing here knows a family by name.
def resolve_family(options: ConvertOptions, config: Mapping[str, Any] | None = None,
                   hint: str | None = None) -> tuple[ModelSpec, list[Finding]]:
    """The spec for this checkpoint, and a problem if ``--model-type-hf`` contradicts the config."""
    registry = get_spec_registry()
    problems: list[Finding] = []
    hint = hint or options.family_hint
    from_config = registry.for_hf_config(config) if config else None
    if options.model_type_hf:
        spec = registry.get(options.model_type_hf)
        if from_config is not None and from_config.name != spec.name:
            problems.append(Finding("model-type-mismatch", f"--model-type-hf {options.model_type_hf} names the "
                                    f"{spec.name} family but config.json describes a {from_config.name} model "
                                    f"(model_type {config.get('model_type')!r})",
                                    f"pass --model-type-hf {from_config.name} or omit it"))
        return spec, problems
    if from_config is not None:
        return from_config, problems
    if hint:
        return registry.get(hint), problems
    raise ConfigMismatch("cannot tell the model family: pass --model-type-hf "
                         f"({', '.join(registry.known())})")


def weight_map_for(spec: ModelSpec, cfg: ModelConfig) -> WeightMap:
    """The family's weight map, or a clear error when the family has none."""
    if spec.weight_map is None:
        raise ConfigMismatch(f"model family {spec.name} has no weight map, so the converter cannot handle it; "
                             f"the families it converts: {', '.join(get_spec_registry().converting())}")
    try:
        wm = spec.weight_map(cfg)
    except ModuleNotFoundError as exc:
        raise ConfigMismatch(f"the weight map of model family {spec.name}{_from(spec)} cannot be imported: "
                             f"{exc}") from None
    if not isinstance(wm, WeightMap):
        raise ConfigMismatch(f"the weight map of family {spec.name} returned {type(wm).__name__}, not a WeightMap")
    return wm


def _from(spec: ModelSpec) -> str:
    return f" (from plugin {spec.owner})" if spec.owner else ""
