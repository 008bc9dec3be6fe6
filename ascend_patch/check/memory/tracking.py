"""The tensor terms of one training step: torch's ``MemTracker`` for the peak, the model and optimizer for the rest.

The same accounting runs on fake tensors (the estimate) and on real ones (``measure``):

* ``params_bytes``: the storages behind the model chunks' parameters and module buffers
  (with Megatron's distributed optimizer, its contiguous parameter buffers, padding included);
* ``grads_bytes``: the storages behind each parameter's ``main_grad`` (Megatron's contiguous
  gradient buffers), or ``.grad`` where there is no ``main_grad``;
* ``optimizer_bytes``: the storages the optimizer holds beyond those two: its state
  (Adam's moments) and its own parameter copies (fp32 main parameters, sharded over DP with
  the distributed optimizer);
* ``activations_bytes``: the peak of live tensor bytes during the measured step, as
  ``MemTracker`` tracked it, minus the three terms above (which are all alive then): saved
  activations of the micro-batches in flight, temporaries, pipeline buffers, the batch,
  Megatron's global buffers and the optimizer step's temporaries, whichever peak is higher.

Storages are counted once however many tensors view them
(``torch.distributed._tools.common_utils.get_untyped_storages``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Terms", "peak_tracker", "state_terms", "state_tensors", "step_terms"]


@dataclass(frozen=True)
class Terms:
    """Bytes per term on one rank; ``peak_bytes`` is what MemTracker saw at the step's peak."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int

    @property
    def tensor_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes


_TRACKER_CLASS: type | None = None


class _NoModules:
    """What MemTracker asks of its ``ModTracker`` (hooks, ``is_bw``, ``parents``), without the module hooks."""

    parents = frozenset({"Global"})

    def register_user_hooks(self, *hooks: Any) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self) -> _NoModules:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    @property
    def is_bw(self) -> bool:
        import torch

        return torch._C._current_graph_task_id() != -1


def peak_tracker() -> Any:
    """A ``MemTracker`` that keeps the peak of live tensor bytes, without per-module tracking.

    MemTracker's ``ModTracker`` hooks every module's forward: it registers a multi-grad hook on
    each module's inputs, and each such hook's closure refers to its tensors, a reference cycle
    that only Python's cyclic collector breaks. Pipeline inputs (leaf tensors that require
    grad) then outlive their micro-batch until a collection happens to run, which made the
    tracked peak depend on the collector's timing (measured: the received inputs of two whole
    iterations alive on the last stage of a PP2 run). The per-module snapshots are not used,
    and skipping them makes the step ~4x faster on fake tensors. Megatron's
    ``DistributedDataParallel`` has an attribute ``buffers`` (its list of contiguous
    parameter/gradient buffers) that shadows ``nn.Module.buffers()``, which MemTracker calls.
    """
    global _TRACKER_CLASS
    if _TRACKER_CLASS is None:
        import torch
        from torch.distributed._tools.mem_tracker import MemTracker

        from torch._subclasses.fake_tensor import FakeTensor

        device_of = torch.ops.prim.device.default
        # MemTracker's own __torch_dispatch__ without the torch._dynamo.disable wrapper torch puts around every
        # mode's (nothing here is compiled; the wrapper costs more than the tracking of most ops)
        track = getattr(MemTracker.__torch_dispatch__, "__wrapped__", MemTracker.__torch_dispatch__)

        class PeakTracker(MemTracker):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False

            def __init__(self) -> None:
                super().__init__()
                self._mod_tracker = _NoModules()

            def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
                shadow = module.__dict__.pop("buffers", None)
                try:
                    return super()._track_module_params_and_buffers(module, install_grad_hooks)
                finally:
                    if shadow is not None:
                        module.__dict__["buffers"] = shadow

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                # a tensor's .device (dispatched for fake tensors from C++, three times as often as every other op
                # together) makes no tensor: answered here as FakeTensor itself answers it outside its kernels,
                # instead of passing through every mode below
                if func is device_of:
                    t = args[0]
                    if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
                        return t.fake_device
                    return func(*args, **(kwargs or {}))
                return track(self, func, types, args, kwargs)

            def peak_total(self) -> int:
                """Bytes of live tensors at the peak since the tracker was last entered."""
                return sum(snap.get("Total", 0) for snap in self.get_tracker_snapshot("peak").values())

        _TRACKER_CLASS = PeakTracker
    return _TRACKER_CLASS()


def _storages(tensors: Iterable[Any]) -> dict[Any, int]:
    from torch.distributed._tools.common_utils import get_untyped_storages

    found: dict[Any, int] = {}
    for t in tensors:
        if t is not None:
            for st in get_untyped_storages(t):
                found[st] = st.nbytes()
    return found


def _optimizers(optimizer: Any) -> list[Any]:
    chained = getattr(optimizer, "chained_optimizers", None)
    return list(chained) if chained else [optimizer]


def state_tensors(model: Any, optimizer: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """(parameter and buffer tensors, gradient tensors, optimizer tensors) of the model chunks and optimizer."""
    import torch

    chunks = model if isinstance(model, (list, tuple)) else [model]
    params = [p for c in chunks for p in c.parameters()]
    params += [b for c in chunks for b in torch.nn.Module.buffers(c)]
    grads = [getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad
             for p in params if isinstance(p, torch.nn.Parameter)]
    opt: list[Any] = []
    for megatron_optimizer in _optimizers(optimizer) if optimizer is not None else []:
        inner = getattr(megatron_optimizer, "optimizer", megatron_optimizer)
        for state in getattr(inner, "state", {}).values():
            opt += [v for v in state.values() if isinstance(v, torch.Tensor)]
        for group in getattr(inner, "param_groups", []):
            for p in group["params"]:
                opt += [p, p.grad]
    return params, grads, opt


def state_terms(model: Any, optimizer: Any) -> Terms:
    """The parameter, gradient and optimizer terms alone (activations 0: no step was watched)."""
    params, grads, opt = state_tensors(model, optimizer)
    p = _storages(params)
    g = {st: n for st, n in _storages(grads).items() if st not in p}
    o = {st: n for st, n in _storages(opt).items() if st not in p and st not in g}
    state = sum(p.values()) + sum(g.values()) + sum(o.values())
    return Terms(sum(p.values()), sum(g.values()), sum(o.values()), 0, state)


def step_terms(tracker: Any, model: Any, optimizer: Any) -> Terms:
    """The terms of the step the tracker just watched (entered fresh for it, so its peak is that step's)."""
    state = state_terms(model, optimizer)
    peak = tracker.peak_total()
    return Terms(state.params_bytes, state.grads_bytes, state.optimizer_bytes, max(0, peak - state.peak_bytes), peak)
