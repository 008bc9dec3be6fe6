"""CUDA environment variables onto their NPU counterparts (npu only).

Backend selection already carries them over before torch_npu is imported (see
:func:`ascend_patch.environ.carry_over_cuda_variables`); these patches do it for a backend
handed to ``apply()`` directly, and make the report show each variable. A counterpart
the user already set wins; ``remove()`` restores the previous environment.
"""

from __future__ import annotations

from ...environ import ENV_COUNTERPARTS
from ...patch import Action, EnvVar, Patch

__all__ = ["ENV_COUNTERPARTS", "environment_patches"]


def environment_patches() -> list[Patch]:
    import os

    patches = []
    for cuda_name, npu_name in ENV_COUNTERPARTS.items():
        def make(current: str | None, cuda_name: str = cuda_name) -> str | None:
            return current if current is not None else os.environ.get(cuda_name)

        patches.append(EnvVar(npu_name, f"{cuda_name} carries over to {npu_name}",
                              make=make, backends=frozenset({"npu"}), action=Action.TRANSLATED,
                              api=cuda_name))
    return patches
