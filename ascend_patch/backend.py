"""The target a patched process runs on (device type, collectives, device module, kernels), and where ops read it."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .config import Settings
from .environ import EnvChanges, EnvTransaction, carry_over_cuda_variables
from .unsupported import UnsupportedOnTarget
from .errors import AscendPatchError

__all__ = [
    "Backend",
    "BackendUnavailable",
    "KernelTable",
    "NPU_KERNEL_NAMES",
    "NPU_TORCH_KERNEL_NAMES",
    "Selection",
    "UnsupportedOnTarget",
    "active_backend",
    "cpu_backend",
    "current_target",
    "npu_backend",
    "probe_npu",
    "select_backend",
    "set_active_backend",
    "using_target",
]

# The torch_npu kernels the ops adaptors may call (documented torch_npu API).
NPU_KERNEL_NAMES: tuple[str, ...] = (
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "npu_scaled_masked_softmax",
    "npu_apply_adam_w",
    "npu_grouped_matmul",
    "npu_moe_token_permute",
    "npu_moe_token_unpermute",
)

# torch's fused optimizer kernels (aten ops, called as ``torch.<name>``), which torch_npu
# registers for npu tensors (what ``torch.optim.AdamW(fused=True)`` runs there). Listed in
# the npu table so the ops' optimizers take them from it (tests inject references).
NPU_TORCH_KERNEL_NAMES: tuple[str, ...] = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_")


class BackendUnavailable(AscendPatchError, RuntimeError):
    """The target that was asked for cannot run in this process."""


class KernelTable:
    """Name -> fused kernel. Empty on cpu (the ops use their pure-torch references).

    Tests inject reference implementations of the documented torch_npu semantics
    with :meth:`override` to exercise the npu argument translation on cpu.
    """

    def __init__(self, kernels: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._kernels: dict[str, Callable[..., Any]] = dict(kernels or {})

    def get(self, name: str) -> Callable[..., Any] | None:
        """The kernel called ``name``, or None when the target has none."""
        return self._kernels.get(name)

    def names(self) -> list[str]:
        return sorted(self._kernels)

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    @contextlib.contextmanager
    def override(self, **kernels: Callable[..., Any] | None) -> Iterator[KernelTable]:
        """Temporarily set (or, with None, drop) kernels; restores the table on exit."""
        saved = dict(self._kernels)
        try:
            for name, fn in kernels.items():
                if fn is None:
                    self._kernels.pop(name, None)
                else:
                    self._kernels[name] = fn
            yield self
        finally:
            self._kernels = saved


@dataclass
class Backend:
    """A target. ``device_module`` is shaped like ``torch.cuda`` (``torch.npu`` on npu).

    Two exist: ``npu``, an Ascend device through torch_npu (collectives ``hccl``, fused kernels
    ``torch_npu.npu_*``), and ``cpu``, the host (collectives ``gloo``, pure-torch reference
    kernels), a real target, not a test trick.
    """

    name: str
    device_type: str
    dist_backend: str
    device_module: Any
    kernels: KernelTable = field(default_factory=KernelTable)
    keeps_index: bool = False  # cuda:N -> npu:N keeps N; the cpu target has one device
    reason: str = ""

    def device(self, index: int | None = None) -> Any:
        """The torch.device that ``cuda`` / ``cuda:index`` becomes on this target."""
        import torch

        if self.keeps_index and index is not None:
            return torch.device(self.device_type, index)
        return torch.device(self.device_type)


_active: Backend | None = None


def active_backend() -> Backend | None:
    """The target this process is patched for, or None when nothing is applied.

    The patch manager (above every other layer) sets it; code below the manager that
    needs the target's kernels at run time (the models' attention) reads it here.
    """
    return _active


def set_active_backend(backend: Backend | None) -> None:
    """Record the target the patch manager applied (None after remove())."""
    global _active
    _active = backend


def current_target() -> Backend:
    """The target an op runs on, read at call time: the one source of every op's kernels.

    The active backend (the target applied now, or the one :func:`using_target` put in
    place); when nothing is applied, the cpu target, whose empty kernel table makes every
    op take its pure-torch reference. So a class or function kept from an earlier apply
    (megatron holds the transformer_engine shim's classes across ``remove()`` and a new
    ``apply()``) always runs on the target of the moment.
    """
    target = _active
    return target if target is not None else _reference()


@functools.cache
def _reference() -> Backend:
    return cpu_backend("nothing is applied: the pure-torch reference")


@contextlib.contextmanager
def using_target(backend: Backend) -> Iterator[Backend]:
    """Make ``backend`` the active target inside the block, then restore the previous one (by identity).

    For tests that inject kernels into a target's table (reference implementations of the
    torch_npu kernels); ops never call it, they read :func:`current_target`.
    """
    global _active
    previous = _active
    _active = backend
    try:
        yield backend
    finally:
        _active = previous


@dataclass(frozen=True)
class Selection:
    """The outcome of backend selection: a backend, or None with the reason nothing applies.

    ``env``: the environment transaction selection wrote through. When the target is
    npu it holds the NPU runtime variables carried over before torch_npu was imported
    (whoever applies the patches restores them with it); otherwise selection has put
    back what it set.
    """

    backend: Backend | None
    reason: str
    env: EnvTransaction = field(default_factory=EnvTransaction, compare=False)

    @property
    def environ(self) -> EnvChanges:
        """(name, value before) of every variable the transaction holds."""
        return self.env.changes


def cpu_backend(reason: str = "asked for") -> Backend:
    """The cpu target: gloo collectives, pure-torch kernels, an emulated device module."""
    from .cpu_device import CpuDeviceModule

    return Backend(
        name="cpu",
        device_type="cpu",
        dist_backend="gloo",
        device_module=CpuDeviceModule(),
        kernels=KernelTable(),
        keeps_index=False,
        reason=reason,
    )


def _npu_kernels(torch_npu: Any) -> KernelTable:
    import torch

    kernels = {n: getattr(torch_npu, n) for n in NPU_KERNEL_NAMES if hasattr(torch_npu, n)}
    kernels.update({n: getattr(torch, n) for n in NPU_TORCH_KERNEL_NAMES if hasattr(torch, n)})
    return KernelTable(kernels)


def npu_backend(reason: str = "asked for") -> Backend:
    """The npu target. Imports torch_npu; raises BackendUnavailable when it cannot run."""
    if importlib.util.find_spec("torch_npu") is None:
        raise BackendUnavailable(
            "ASCEND_PATCH_DEVICE=npu but torch_npu is not installed; install the npu extra "
            "(pip install 'ascend_patch[npu]') on an Ascend host with CANN, or use "
            "ASCEND_PATCH_DEVICE=cpu"
        )
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # torch_npu raises various errors without CANN
        raise BackendUnavailable(
            f"ASCEND_PATCH_DEVICE=npu but torch_npu failed to import ({type(exc).__name__}: {exc}); "
            "is CANN installed and set_env.sh sourced? `ascend-patch doctor` explains more"
        ) from exc
    import torch

    return Backend(
        name="npu",
        device_type="npu",
        dist_backend="hccl",
        device_module=torch.npu,  # type: ignore[attr-defined]
        kernels=_npu_kernels(torch_npu),
        keeps_index=True,
        reason=reason,
    )


def probe_npu() -> tuple[bool, str]:
    """Whether torch_npu imports and sees a device, with the reason. Never raises."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401
        import torch

        count = torch.npu.device_count()  # type: ignore[attr-defined]
    except Exception as exc:
        return False, f"torch_npu is installed but failed to import ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "torch_npu imported but sees no NPU device"
    return True, f"torch_npu sees {count} NPU device(s)"


def _real_cuda_devices() -> int:
    import torch

    try:
        if torch.backends.cuda.is_built() and torch.cuda.is_available():
            return int(torch.cuda.device_count())
    except Exception:
        return 0
    return 0


def select_backend(settings: Settings, env: EnvTransaction | None = None) -> Selection:
    """Pick the target the settings ask for (see ``ASCEND_PATCH_DEVICE``).

    torch_npu is imported only when the npu target is asked for or ``auto`` probes for it, the probe
    guarded: torch_npu raises at import on a host without CANN.

    Before torch_npu is imported or probed (npu, auto), the CUDA environment variables
    are carried over to the NPU runtime's (``CUDA_VISIBLE_DEVICES`` ->
    ``ASCEND_RT_VISIBLE_DEVICES``, ...) through ``env`` (a new transaction when None);
    when the target turns out not to be npu, what selection set is put back.
    """
    env = EnvTransaction() if env is None else env
    if not settings.enabled:
        return Selection(None, "ASCEND_PATCH=0: ascend_patch is disabled", env)
    if settings.device == "cpu":
        return Selection(cpu_backend("ASCEND_PATCH_DEVICE=cpu"), "ASCEND_PATCH_DEVICE=cpu", env)
    savepoint = env.savepoint()
    carry_over_cuda_variables(env)
    try:
        selection = _select_npu_or_auto(settings)
    except BaseException:
        env.restore(savepoint)
        raise
    if selection.backend is None or selection.backend.name != "npu":
        env.restore(savepoint)
    return replace(selection, env=env)


def _select_npu_or_auto(settings: Settings) -> Selection:
    if settings.device == "npu":
        return Selection(npu_backend("ASCEND_PATCH_DEVICE=npu"), "ASCEND_PATCH_DEVICE=npu")
    has_npu, why = probe_npu()
    if has_npu:
        return Selection(npu_backend(f"auto: {why}"), f"auto: {why}")
    cuda = _real_cuda_devices()
    if cuda:
        return Selection(
            None,
            f"auto: {why}, and this machine has {cuda} real CUDA device(s); ascend_patch leaves "
            "the process unpatched (set ASCEND_PATCH_DEVICE=cpu to force the cpu target)",
        )
    return Selection(cpu_backend(f"auto: {why}"), f"auto: {why}; using the cpu target")
