"""Typed settings, read once from the ``ASCEND_PATCH_*`` environment variables.

Every variable this package understands is declared in :data:`VARIABLES`; a bad
value, or an ``ASCEND_PATCH_*`` name that is not declared (usually a typo), is a
:class:`ConfigError` naming the variable and what it accepts.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from .errors import AscendPatchError

__all__ = ["ConfigError", "Settings", "VARIABLES", "read_settings"]

PREFIX = "ASCEND_PATCH"


class ConfigError(AscendPatchError, ValueError):
    """An ``ASCEND_PATCH_*`` variable has a value (or a name) this package does not accept."""


@dataclass(frozen=True)
class _Var:
    name: str
    field: str
    choices: tuple[str, ...] | None  # None: free text
    default: str
    help: str


VARIABLES: tuple[_Var, ...] = (
    _Var("ASCEND_PATCH", "enabled", ("0", "1"), "1",
         "0 disables everything: import ascend_patch then patches nothing."),
    _Var("ASCEND_PATCH_DEVICE", "device", ("auto", "npu", "cpu"), "auto",
         "target: npu (torch_npu, hccl), cpu (gloo, pure-torch kernels); auto picks npu when "
         "torch_npu imports and sees a device, else cpu, and patches nothing on a CUDA machine."),
    _Var("ASCEND_PATCH_STRICT", "strict", ("0", "1"), "0",
         "1 makes a skipped patch (missing target, package version out of range) or a failed "
         "plugin an error."),
    _Var("ASCEND_PATCH_REPORT", "report", ("0", "1", "all"), "0",
         "1 prints the migration report at exit on rank 0; all prints it on every rank."),
    _Var("ASCEND_PATCH_CUDA_IS_AVAILABLE", "cuda_is_available", ("0", "1"), "1",
         "1: torch.cuda.is_available() answers True while patched, so CUDA code paths run."),
    _Var("ASCEND_PATCH_DISABLE_PLUGINS", "disable_plugins", None, "",
         "comma-separated plugin names that are not loaded."),
    _Var("ASCEND_PATCH_AUTOLOAD", "autoload", ("0", "1"), "0",
         "1 patches every Python process that starts (through the installed .pth file)."),
    _Var("ASCEND_PATCH_CPU_DEVICES", "cpu_devices", None, "",
         "N: the cpu target presents N virtual devices to every patched process "
         "(launchers under ASCEND_PATCH_AUTOLOAD=1 too), as a node with N GPUs would; "
         "CUDA_VISIBLE_DEVICES still narrows it."),
    _Var("ASCEND_PATCH_TRAINING_LOG", "training_log", None, "",
         "a file path: Megatron-LM's training loop also appends each iteration's losses, grad norm, "
         "learning rate and loss scale there as JSON lines, with full precision (written by the rank "
         "that prints Megatron's log line)."),
)
_BY_NAME = {v.name: v for v in VARIABLES}


@dataclass(frozen=True)
class Settings:
    """What the environment asked for. Build one with :func:`read_settings`."""

    enabled: bool = True
    device: str = "auto"
    strict: bool = False
    report: str = "0"
    cuda_is_available: bool = True
    disable_plugins: tuple[str, ...] = field(default_factory=tuple)
    autoload: bool = False
    cpu_devices: str = ""
    training_log: str = ""

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed (used by the CLI's flags)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_environ(self) -> dict[str, str]:
        """The ``ASCEND_PATCH_*`` variables that reproduce these settings in another process."""
        env = {}
        for var in VARIABLES:
            value = getattr(self, var.field)
            if isinstance(value, bool):
                env[var.name] = "1" if value else "0"
            elif isinstance(value, tuple):
                env[var.name] = ",".join(value)
            else:
                env[var.name] = str(value)
        return env

    @property
    def report_enabled(self) -> bool:
        return self.report != "0"


def _convert(var: _Var, raw: str) -> object:
    value = raw.strip()
    if var.choices is not None:
        if value not in var.choices:
            allowed = ", ".join(var.choices)
            raise ConfigError(
                f"{var.name}={raw!r} is not allowed; use one of: {allowed} ({var.help})"
            )
    if var.field == "disable_plugins":
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if var.field == "cpu_devices" and not (value.isdigit() and int(value) > 0):
        raise ConfigError(f"{var.name}={raw!r} is not allowed; use a positive integer ({var.help})")
    if var.choices == ("0", "1"):
        return value == "1"
    return value


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every ``ASCEND_PATCH_*`` variable from ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name, raw in env.items():
        if name != PREFIX and not name.startswith(PREFIX + "_"):
            continue
        var = _BY_NAME.get(name)
        if var is not None and raw.strip() == "":
            continue  # `VAR=` in a shell means "not set"
        if var is None:
            close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            known = ", ".join(_BY_NAME)
            raise ConfigError(f"unknown variable {name}{hint} (known: {known})")
        values[var.field] = _convert(var, raw)
    return Settings(**values)  # type: ignore[arg-type]
