"""The built-in Megatron plugin: the patches stock megatron-core needs on the targets, for its release.

What the device and comm adaptors already cover is not repeated here (docs/megatron.md):
``torch.cuda.current_device()`` as a device, literal ``device="cuda"``, CUDA type strings,
``torch.cuda.synchronize``, ``.cuda()`` and ``nccl`` process groups all work through those.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from ...config import Settings
from ...errors import AscendPatchError
from ...hookspec import PackageVersion, Target, hookimpl
from ...patch import Patch
from . import releases
from .detect import find_megatron

__all__ = ["UnsupportedMegatron", "ascend_patch_package_version", "ascend_patch_register_patches",
           "check_release", "megatron_patches"]


class UnsupportedMegatron(AscendPatchError, RuntimeError):
    """The megatron-core on the path is outside the supported releases (fatal with ASCEND_PATCH_STRICT=1)."""


_warned: set[str] = set()


def megatron_patches(backend: Any) -> list[Any]:
    """Every Megatron patch for ``backend`` (the registry drops those for other targets)."""
    from . import dist_ckpt, fp8_config, fusions, jit, moe, norms, optimizer, p2p, rng, wgrad
    from .te.shims import te_shim_patches

    return [*jit.jit_patches(), *rng.rng_patches(), *norms.norm_patches(backend), *wgrad.wgrad_patches(),
            *optimizer.optimizer_patches(), *p2p.p2p_patches(),
            *fp8_config.te_patches(), *fusions.megatron_patches(backend), *te_shim_patches(backend),
            *moe.moe_patches(backend), *dist_ckpt.dist_ckpt_patches()]


def check_release(strict: bool) -> None:
    """Warn once (raise when ``strict``) when the megatron-core this process imports is not supported."""
    found = find_megatron()
    if found is None or releases.supported(found.version):
        return
    outside = f"{found.describe()} is outside the releases ascend_patch supports ({releases.supported_text()})"
    if releases.older(found.version):
        outside += ("; to move up, convert its checkpoints with ascend-patch convert, which reads the legacy torch "
                    "format of megatron-core's GPT model (docs/megatron.md, 'Out of range')")
    if strict:
        raise UnsupportedMegatron(f"{outside}; ASCEND_PATCH_STRICT=1 refuses it. Use a supported release "
                                  "(docs/megatron.md, 'Megatron releases'), or run without ASCEND_PATCH_STRICT to "
                                  "apply the patches on a best-effort basis")
    if found.path not in _warned:
        _warned.add(found.path)
        warnings.warn(f"ascend_patch: {outside}: its patches are applied where their targets exist, on a "
                      "best-effort basis. Use a supported release (docs/megatron.md, 'Megatron releases'); "
                      "ASCEND_PATCH_STRICT=1 refuses to run", stacklevel=3)


class _CheckOnImport:
    """Runs :func:`check_release` when megatron.core is imported (at once if it is): ``sys.path`` is final
    then (``python -m ascend_patch SCRIPT`` applies before the script's folder is on it)."""

    strict = False
    watching = False

    def watch(self, strict: bool) -> None:
        self.strict = strict
        if "megatron.core" in sys.modules:  # imported before this apply: check it now
            check_release(strict)
            return
        found = find_megatron()
        if found is not None and releases.older(found.version):
            # an older release may not even import here (core_r0.8.0 imports pkg_resources, which setuptools
            # 81+ lacks): say now what it is and how to move up; the import, if it works, is checked again
            check_release(False)
        if not self.watching:
            import wrapt

            self.watching = True
            wrapt.register_post_import_hook(self, "megatron.core")

    def __call__(self, _module: Any) -> None:
        from ...backend import active_backend

        self.watching = False  # wrapt forgets a hook once it has fired
        if active_backend() is not None:  # patched now: this is the megatron-core the patches meet
            check_release(self.strict)


_check_on_import = _CheckOnImport()


@hookimpl
def ascend_patch_register_patches(backend: Target, settings: Settings) -> list[Patch]:
    _check_on_import.watch(settings.strict)
    return megatron_patches(backend)


@hookimpl
def ascend_patch_package_version(package: str) -> PackageVersion | None:
    if package != releases.PACKAGE:
        return None
    found = find_megatron()
    return None if found is None else PackageVersion(found.version, found.where())
