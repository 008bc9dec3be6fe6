"""CUDA environment variables onto their target counterparts (npu only).

Set before the first device use, so the runtime sees them. A counterpart the user
already set wins; ``remove()`` restores the previous environment.
"""

from __future__ import annotations

from ..patch import Action, Patch, PatchKind

__all__ = ["ENV_COUNTERPARTS", "environment_patches"]

# CUDA variable -> NPU variable with the same meaning.
ENV_COUNTERPARTS = {
    "CUDA_VISIBLE_DEVICES": "ASCEND_RT_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF": "PYTORCH_NPU_ALLOC_CONF",
    "CUDA_LAUNCH_BLOCKING": "ASCEND_LAUNCH_BLOCKING",
}


def environment_patches() -> list[Patch]:
    import os

    patches = []
    for cuda_name, npu_name in ENV_COUNTERPARTS.items():
        def make(current: str | None, cuda_name: str = cuda_name) -> str | None:
            return current if current is not None else os.environ.get(cuda_name)

        patches.append(Patch(npu_name, PatchKind.ENV, f"{cuda_name} carries over to {npu_name}",
                             make=make, backends=frozenset({"npu"}), action=Action.TRANSLATED,
                             api=cuda_name))
    return patches
