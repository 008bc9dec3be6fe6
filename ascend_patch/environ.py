"""One record of every environment variable ascend_patch sets, so each is put back exactly.

Three things set variables: ``import ascend_patch`` before ``import torch`` (torch's
device-backend autoload imports torch_npu inside ``import torch``, and the NPU runtime
reads ``ASCEND_RT_VISIBLE_DEVICES`` then), backend selection (before torch_npu is
imported or probed), and ``EnvVar`` patches. All of them write through the process's
:class:`EnvTransaction`; ``remove()`` (or a target that turns out not to be npu)
restores it, and each variable gets back the value it had before the first write.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = [
    "ENV_COUNTERPARTS",
    "EnvChanges",
    "EnvTransaction",
    "carry_over_cuda_variables",
    "process_environment",
]

# CUDA variable -> the NPU runtime's variable with the same meaning.
ENV_COUNTERPARTS = {
    "CUDA_VISIBLE_DEVICES": "ASCEND_RT_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF": "PYTORCH_NPU_ALLOC_CONF",
    "CUDA_LAUNCH_BLOCKING": "ASCEND_LAUNCH_BLOCKING",
}

EnvChanges = tuple[tuple[str, "str | None"], ...]


class EnvTransaction:
    """Sets environment variables and remembers, for each, the value it had before (None: unset).

    ``restore()`` puts every variable back, newest first; ``restore(savepoint)`` only
    those first set after :meth:`savepoint` was taken.
    """

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self._environ = environ  # None: os.environ, looked up at each use
        self._before: dict[str, str | None] = {}  # insertion order is the order of first writes

    @property
    def environ(self) -> MutableMapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def set(self, name: str, value: str) -> None:
        """Set ``name`` to ``value``, remembering its value before the transaction's first write."""
        env = self.environ
        if name not in self._before:
            self._before[name] = env.get(name)
        env[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._before

    def __len__(self) -> int:
        return len(self._before)

    @property
    def changes(self) -> EnvChanges:
        """(name, value before) of every variable set, in the order they were first set."""
        return tuple(self._before.items())

    def savepoint(self) -> int:
        """A mark :meth:`restore` can go back to."""
        return len(self._before)

    def restore(self, savepoint: int = 0) -> None:
        """Put back every variable first set after ``savepoint`` (default: all of them)."""
        env = self.environ
        names = list(self._before)[savepoint:]
        for name in reversed(names):
            before = self._before.pop(name)
            if before is None:
                env.pop(name, None)
            else:
                env[name] = before

    def __repr__(self) -> str:
        return f"EnvTransaction({', '.join(f'{n}={self.environ.get(n)!r}' for n in self._before)})"


def carry_over_cuda_variables(env: EnvTransaction) -> None:
    """Give each NPU runtime variable the value of its CUDA counterpart, through ``env``.

    A counterpart that is already set wins. This has to happen before torch_npu is
    imported and before it is asked for devices: the runtime reads the variables then.
    """
    current = env.environ
    for cuda_name, npu_name in ENV_COUNTERPARTS.items():
        value = current.get(cuda_name)
        if value is not None and npu_name not in current:
            env.set(npu_name, value)


_PROCESS = EnvTransaction()


def process_environment() -> EnvTransaction:
    """The process's transaction, shared by ``import ascend_patch``, backend selection and EnvVar patches."""
    return _PROCESS
