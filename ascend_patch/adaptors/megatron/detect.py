"""Which megatron-core the process will import: read from its ``package_info.py``, without importing it."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

__all__ = ["FoundMegatron", "find_megatron", "read_package_info"]

_FIELDS = ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE")


@dataclass(frozen=True)
class FoundMegatron:
    """The megatron-core a process imports: its version, where it is, and what kind of install it is."""

    version: str  # "0.17.1", as package_info.__version__ says it
    path: str  # the megatron/core directory
    kind: str  # "wheel" (the installed distribution's own files) or "checkout" (a source tree on sys.path)
    wheel: str | None = None  # the installed megatron-core distribution's version, if any
    commit: str | None = None  # a checkout's git commit, when it has its .git

    def where(self) -> str:
        """``checkout /x/megatron/core, shadows the installed wheel 0.16.1``."""
        where = f"{self.kind} {self.path}"
        if self.commit:
            where += f" at {self.commit}"
        if self.kind == "checkout" and self.wheel:
            where += f", shadows the installed wheel {self.wheel}"
        return where

    def describe(self) -> str:
        """``megatron-core 0.17.1 (checkout /x/megatron/core, shadows the installed wheel 0.16.1)``."""
        return f"megatron-core {self.version} ({self.where()})"


def read_package_info(path: str) -> str:
    """``__version__`` of a megatron-core ``package_info.py``, from its constants (the file is not run).

    Every release spells it ``MAJOR``, ``MINOR``, ``PATCH``, ``PRE_RELEASE`` (main also asks git for
    its commit when it is imported, which is why it is read, not imported).
    """
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in _FIELDS and isinstance(node.value, ast.Constant):
                values.setdefault(name, node.value.value)
    missing = [name for name in _FIELDS[:3] if not isinstance(values.get(name), int)]
    if missing:
        raise ValueError(f"{path} does not define {', '.join(missing)} as numbers; cannot tell the megatron-core "
                         "release")
    return ".".join(str(values[name]) for name in _FIELDS[:3]) + str(values.get("PRE_RELEASE") or "")


def _core_dir() -> str | None:
    """The ``megatron/core`` directory ``import megatron.core`` resolves to now."""
    core = sys.modules.get("megatron.core")
    if core is not None and getattr(core, "__path__", None):
        return list(core.__path__)[0]
    try:
        spec = importlib.util.find_spec("megatron")  # a top-level spec: nothing is imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():  # megatron/ is a namespace package: first wins
        candidate = os.path.join(location, "core")
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def _wheel() -> tuple[str | None, str | None]:
    """(version, megatron/core directory) of the installed megatron-core distribution."""
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    return dist.version, os.path.realpath(str(dist.locate_file(os.path.join("megatron", "core"))))


def _git_commit(path: str) -> str | None:
    """The short commit a checkout at ``path`` (or above it) has checked out, read from its .git."""
    here = os.path.realpath(path)
    while True:
        git = os.path.join(here, ".git")
        if os.path.isdir(git):
            try:
                with open(os.path.join(git, "HEAD"), encoding="utf-8") as f:
                    head = f.read().strip()
                if head.startswith("ref: "):
                    with open(os.path.join(git, *head[5:].split("/")), encoding="utf-8") as f:
                        head = f.read().strip()
            except OSError:
                return None
            return head[:12] or None
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def find_megatron() -> FoundMegatron | None:
    """The megatron-core this process imports (or would import now), or None when there is none."""
    core = _core_dir()
    if core is None:
        return None
    info = os.path.join(core, "package_info.py")
    imported = sys.modules.get("megatron.core.package_info")
    if imported is not None and isinstance(getattr(imported, "__version__", None), str):
        version = imported.__version__
    elif os.path.isfile(info):
        version = read_package_info(info)
    else:
        return None
    wheel, wheel_core = _wheel()
    kind = "wheel" if wheel_core is not None and os.path.realpath(core) == wheel_core else "checkout"
    return FoundMegatron(version, core, kind, wheel, _git_commit(core) if kind == "checkout" else None)
