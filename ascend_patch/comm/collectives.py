"""Collectives gloo (torch 2.13) lacks, rebuilt from the forms it has; cpu target only.

Measured by running every collective Megatron-style training uses over gloo at world
sizes 2 and 4 (fp32, bf16, fp16, fp64, int32/64, uint8, bool, complex64; sync, async,
inside ``_coalescing_manager``). gloo handles natively, so nothing is patched for:
all_reduce / reduce_scatter_tensor / all_to_all_single (even and uneven splits) /
broadcast / reduce / batch_isend_irecv in bf16 and fp16 (reduced in the dtype, as
NCCL's ring does, with identical results on every rank), ReduceOp.AVG/MAX/MIN/PRODUCT,
async handles, coalesced all_reduce / all_gather_into_tensor / reduce_scatter_tensor
of one dtype, uneven ``reduce_scatter`` lists. What gloo lacks, and the fallback:

===============================================  ==========================================
gap (what gloo does)                             fallback (result lands in the caller's tensor)
===============================================  ==========================================
all_gather_into_tensor with the stacked output   gather into the flattened views
``[world, *input.shape]`` or a 0-d input
(RuntimeError "invalid tensor size")
reduce_scatter_tensor with the stacked input     reduce-scatter the flattened views
``[world, *output.shape]`` (RuntimeError)
all_gather into a list of unequal sizes          pad to the largest, all_gather_into_tensor,
(RuntimeError "invalid tensor size")             copy each rank's part out
coalesced all_reduce of mixed dtypes             one coalesced all_reduce per dtype
("tensors must all have the same type")
ReduceOp.PREMUL_SUM (``_make_nccl_premul_sum``)  multiply by the factor, then SUM
("Cannot use ReduceOp.PREMUL_SUM with Gloo")
float8 tensors ("Invalid scalar type")           movement (broadcast, gathers, all_to_all)
                                                 through uint8 views; reductions in fp32,
                                                 cast back
===============================================  ==========================================

Async semantics are kept: with ``async_op=True`` the handle is a
:class:`FallbackWork` whose ``wait()`` (or ``is_completed()`` turning True, or its
future) also finishes the copy into the caller's tensor. Integer ``ReduceOp.AVG``
is left as gloo has it (an error), and float8 point-to-point is not emulated.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..patch import Action, Patch, Replace, replacing
from ..usage import note

__all__ = ["FallbackWork", "collective_patches", "premul_factor"]

_C10D = "torch.distributed.distributed_c10d"
_TORCH_RANGE = ">=2.13,<2.14"  # the gaps above were measured on torch 2.13's gloo
_FP8 = frozenset(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                             "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n))
# process group -> copies to run once its coalesced work completes
_PENDING: dict[Any, list[Callable[[], Any]]] = {}
# id(ReduceOp) -> (weakref to it, factor): the PREMUL_SUM ops made by _make_nccl_premul_sum
_PREMUL: dict[int, tuple[Any, Any]] = {}


class FallbackWork(dist.Work):
    """An async handle over the works a fallback issued, finishing its copies on completion."""

    def __init__(self, works: list[Any], finishers: list[Callable[[], Any]]) -> None:
        super().__init__()
        self._works = [w for w in works if w is not None]
        self._finishers = list(finishers)
        self._lock = threading.Lock()
        self._finished = False

    def _finish(self) -> None:
        with self._lock:
            if self._finished:
                return
            for finish in self._finishers:
                finish()
            self._finished = True

    def wait(self, timeout: Any = None) -> bool:  # type: ignore[override]
        for work in self._works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        self._finish()
        return True

    def synchronize(self) -> None:  # type: ignore[override]
        self.wait()

    def is_completed(self) -> bool:  # type: ignore[override]
        if all(w.is_completed() for w in self._works):
            self._finish()
            return True
        return False

    def is_success(self) -> bool:  # type: ignore[override]
        return all(w.is_success() for w in self._works)

    def exception(self) -> Any:  # type: ignore[override]
        for work in self._works:
            error = work.exception()
            if error is not None:
                return error
        return None

    def get_future(self) -> torch.futures.Future:  # type: ignore[override]
        futures = [w.get_future() for w in self._works]

        def done(_: Any) -> list[Any]:
            self._finish()
            return []

        if not futures:
            ready: torch.futures.Future = torch.futures.Future()
            ready.set_result(done(None))
            return ready
        return torch.futures.collect_all(futures).then(done)


def premul_factor(op: Any) -> Any:
    """The factor of a ``_make_nccl_premul_sum(factor)`` op, or None for any other op."""
    if not _PREMUL:
        return None
    entry = _PREMUL.get(id(op))
    if entry is None or entry[0]() is not op:
        return None
    return entry[1]


def _make_premul(original: Any) -> Any:
    @replacing(original)
    def _make_nccl_premul_sum(factor: Any) -> Any:
        op = original(factor)
        key = id(op)
        _PREMUL[key] = (weakref.ref(op), factor)
        weakref.finalize(op, _PREMUL.pop, key, None)
        return op

    return _make_nccl_premul_sum


def _capturing(group: Any) -> Any:
    """The process group whose coalescing manager is capturing collectives now, else None."""
    from torch.distributed import distributed_c10d as c10d

    state = c10d._world.pg_coalesce_state
    if not state:
        return None
    pg = group if group is not None else c10d._get_default_group()
    return pg if pg in state else None


def _complete(work: Any, finish: Callable[[], Any], group: Any, async_op: bool) -> Any:
    """Run ``finish`` when the collective behind ``work`` is done; return the caller's handle."""
    pg = _capturing(group)
    if pg is not None:
        pending = _PENDING.get(pg)
        if pending is None:
            raise RuntimeError(
                "ascend_patch: a gloo fallback collective ran inside a _coalescing_manager that "
                "ascend_patch did not patch (it was imported before ascend_patch applied); use "
                "torch.distributed._coalescing_manager after ascend_patch.apply()")
        pending.append(finish)
        return work
    if async_op and work is not None:
        return FallbackWork([work], [finish])
    finish()
    return work


def _flat(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], Any] | None]:
    """A 1-D view of ``tensor`` to write into, and the copy-back a non-contiguous one needs."""
    if tensor.is_contiguous():
        return tensor.view(-1), None
    scratch = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    return scratch, lambda: tensor.copy_(scratch.view(tensor.shape))


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.dtype in _FP8 else tensor


def _all_reduce(original: Any) -> Any:
    @replacing(original)
    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Any:
        factor = premul_factor(op)
        fp8 = tensor.dtype in _FP8
        if factor is None and not fp8:
            return original(tensor, op, group, async_op)
        if factor is not None:
            note("torch.distributed.all_reduce(op=PREMUL_SUM) on gloo", "emulated")
            op = dist.ReduceOp.SUM
        if not fp8:
            tensor.mul_(factor)
            return original(tensor, op, group, async_op)
        note("torch.distributed.all_reduce(float8) on gloo", "emulated")
        wide = tensor.float()
        if factor is not None:
            wide.mul_(factor)
        work = original(wide, op, group, async_op)
        return _complete(work, lambda: tensor.copy_(wide), group, async_op)

    return all_reduce


def _all_gather_single(original: Any) -> Any:
    @replacing(original)
    def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                          async_op: bool = False) -> Any:
        reshape = output_tensor.dim() != input_tensor.dim() or input_tensor.dim() == 0
        fp8 = input_tensor.dtype in _FP8
        if not reshape and not fp8:
            return original(output_tensor, input_tensor, group, async_op)
        note("torch.distributed.all_gather_into_tensor (stacked/0-d/float8) on gloo", "emulated")
        out, inp = _bytes(output_tensor), _bytes(input_tensor)
        finish = None
        if reshape:
            out, finish = _flat(out)
            inp = inp.reshape(-1)
        work = original(out, inp, group, async_op)
        return work if finish is None else _complete(work, finish, group, async_op)

    return all_gather_single


def _reduce_scatter_single(original: Any) -> Any:
    @replacing(original)
    def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                              group: Any = None, async_op: bool = False) -> Any:
        reshape = input.dim() != output.dim()
        fp8 = input.dtype in _FP8
        factor = premul_factor(op)
        if not reshape and not fp8 and factor is None:
            return original(output, input, op, group, async_op)
        note("torch.distributed.reduce_scatter_tensor (stacked/PREMUL_SUM/float8) on gloo", "emulated")
        finishes: list[Callable[[], Any]] = []
        inp, out = input, output
        if fp8:
            inp = input.float()
            wide = torch.empty(output.shape, dtype=torch.float32, device=output.device)
            finishes.append(lambda: output.copy_(wide))
            out = wide
        if factor is not None:
            inp = inp * factor  # a new tensor: the caller's input stays as it was
            op = dist.ReduceOp.SUM
        if reshape:
            inp = inp.reshape(-1)
            out, copy_back = _flat(out)
            if copy_back is not None:
                finishes.insert(0, copy_back)
        work = original(out, inp, op, group, async_op)
        if not finishes:
            return work

        def finish() -> None:
            for step in finishes:
                step()

        return _complete(work, finish, group, async_op)

    return reduce_scatter_single


def _all_gather(original: Any) -> Any:
    @replacing(original)
    def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                   async_op: bool = False) -> Any:
        shape = tensor.shape
        uneven = any(t.shape != shape for t in tensor_list)
        fp8 = tensor.dtype in _FP8
        if not uneven and not fp8:
            return original(tensor_list, tensor, group, async_op)
        if not uneven:
            note("torch.distributed.all_gather(float8) on gloo", "emulated")
            return original([_bytes(t) for t in tensor_list], _bytes(tensor), group, async_op)
        note("torch.distributed.all_gather (unequal sizes) on gloo", "emulated")
        from torch.distributed import distributed_c10d as c10d

        if c10d._rank_not_in_group(group):
            return original(tensor_list, tensor, group, async_op)
        sizes = [t.numel() for t in tensor_list]
        width = max(sizes)
        piece = _bytes(tensor).reshape(-1)
        padded = piece.new_zeros(width)
        padded[: piece.numel()].copy_(piece)
        gathered = piece.new_empty(width * len(tensor_list))
        work = c10d.all_gather_single(gathered, padded, group, async_op)

        def finish() -> None:
            for i, (out, size) in enumerate(zip(tensor_list, sizes)):
                _bytes(out).copy_(gathered[i * width: i * width + size].view(out.shape))

        return _complete(work, finish, group, async_op)

    return all_gather


def _broadcast(original: Any) -> Any:
    @replacing(original)
    def broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False,
                  group_src: int | None = None) -> Any:
        if tensor.dtype in _FP8:
            note("torch.distributed.broadcast(float8) on gloo", "emulated")
            tensor = tensor.view(torch.uint8)
        return original(tensor, src, group, async_op, group_src)

    return broadcast


def _all_to_all_single(original: Any) -> Any:
    @replacing(original)
    def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                          input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if input.dtype in _FP8:
            note("torch.distributed.all_to_all_single(float8) on gloo", "emulated")
            output, input = output.view(torch.uint8), input.view(torch.uint8)
        return original(output, input, output_split_sizes, input_split_sizes, group, async_op)

    return all_to_all_single


def _coalescing_manager(original: Any) -> Any:
    @replacing(original)
    @contextlib.contextmanager
    def _coalescing_manager(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[Any]:
        from torch.distributed import distributed_c10d as c10d

        pg = group if group is not None else c10d._get_default_group()
        finishers: list[Callable[[], Any]] = []
        regroup: list[Any] = []
        _PENDING[pg] = finishers
        try:
            with original(pg, device, async_ops) as cm:
                before = len(cm.works)
                yield cm
                ops = c10d._world.pg_coalesce_state.get(pg)
                if (ops and all(o.op is c10d.all_reduce for o in ops)
                        and len({o.tensor.dtype for o in ops}) > 1):
                    regroup = list(ops)
                    ops.clear()  # torch's exit then has nothing to issue; we issue per dtype below
        finally:
            _PENDING.pop(pg, None)
        if not regroup and not finishers:
            return
        works = list(cm.works[before:])
        if regroup:
            note("torch.distributed._coalescing_manager (all_reduce of mixed dtypes) on gloo", "emulated")
            by_dtype: dict[torch.dtype, list[Any]] = {}
            for op in regroup:
                by_dtype.setdefault(op.tensor.dtype, []).append(op)
            for same in by_dtype.values():
                with original(pg, device, async_ops) as part:
                    for op in same:
                        c10d.all_reduce(op.tensor, op.redop, pg)
                works.extend(part.works)
        if async_ops:
            cm.works[before:] = [FallbackWork(works, finishers)]
        else:
            for finish in finishers:
                finish()

    return _coalescing_manager


def collective_patches() -> list[Patch]:
    """The gloo fallbacks (cpu target, torch 2.13)."""
    cpu = frozenset({"cpu"})

    def patch(name: str, make: Callable[[Any], Any], reason: str, module: str = _C10D) -> Patch:
        return Replace(f"{module}:{name}", reason, make=make, backends=cpu,
                       package="torch", versions=_TORCH_RANGE, action=Action.EMULATED, count_calls=False)

    return [
        patch("all_reduce", _all_reduce, "PREMUL_SUM and float8 all_reduce, which gloo lacks"),
        patch("all_gather_single", _all_gather_single,
              "stacked-output, 0-d and float8 all_gather_into_tensor, which gloo lacks"),
        patch("reduce_scatter_single", _reduce_scatter_single,
              "stacked-input, PREMUL_SUM and float8 reduce_scatter_tensor, which gloo lacks"),
        patch("all_gather", _all_gather, "all_gather into unequal sizes and float8, which gloo lacks"),
        patch("broadcast", _broadcast, "float8 broadcast, which gloo lacks"),
        patch("all_to_all_single", _all_to_all_single, "float8 all_to_all_single, which gloo lacks"),
        patch("_coalescing_manager", _coalescing_manager,
              "coalesced all_reduce of mixed dtypes, and fallbacks finishing when coalesced work completes"),
        patch("_make_nccl_premul_sum", _make_premul, "remembers the factor so PREMUL_SUM can be emulated",
              module="torch.distributed"),
    ]
