"""The built-in model-family plugin: it collects the spec each family folder declares.

Every subpackage of ``ascend_patch.models`` with a ``SPEC`` (a :class:`ModelSpec`) is a
family; adding one is adding a folder. Importing a family imports only its config
mapping: layer specs (megatron-core) and weight maps are imported when first used.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..hookspec import hookimpl
from .registry import ModelSpec

__all__ = ["ascend_patch_model_specs", "builtin_specs"]


def builtin_specs() -> list[ModelSpec]:
    """The spec of every family folder under ascend_patch/models/, by name."""
    package = importlib.import_module(__package__)
    specs = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            spec = getattr(importlib.import_module(f"{__package__}.{info.name}"), "SPEC", None)
            if isinstance(spec, ModelSpec):
                specs.append(spec)
    return sorted(specs, key=lambda s: s.name)


@hookimpl
def ascend_patch_model_specs() -> list[ModelSpec]:
    return builtin_specs()
