"""What a fake tensor cannot say, answered and written down.

:func:`Answers` makes a ``TorchDispatchMode`` that sits above torch's ``FakeTensorMode``:

* an op whose tensor inputs are all real (host bookkeeping such as Megatron's RNG-state
  comparison) runs for real, as it would in the job;
* small tensors whose values decide shapes (MoE token counts) carry real *shadows*
  (:mod:`.shadows`): ``.item()``, ``.tolist()``, ``.numpy()`` and the ops whose output
  shape depends on values read them;
* any other value-dependent question about a fake tensor (``.item()``, ``bool(t)``,
  ``torch.equal``) gets the answer of an ordinary training step (no NaN, no overflow, a
  finite gradient norm; RoPE's two half tables equal); every question, its answer and the
  code that asked are counted in ``asked``, which the report prints;
* the coalesced collectives torch has no fake kernel for run as their one-tensor forms
  (same outputs, same memory);
* every collective's process group is recorded (``groups``, ``peers``): the communicators a
  rank really uses, which is what the HCCL buffer term counts.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from .shadows import Shadows, balanced_topk, collective_shadow

__all__ = ["Answers"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    """The innermost frame outside torch and this package: the code that asked."""
    frame = sys._getframe(2)
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "")
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(torch_dir) and not name.startswith(_HERE) and "contextlib" not in name:
            return f"{os.path.basename(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


def _make_mode_class() -> type:  # noqa: C901 (one dispatch table, read top to bottom)
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                               FakeTensor, unset_fake_temporarily)
    from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map_only

    aten, c10d = torch.ops.aten, torch.ops.c10d
    coalesced = {c10d.allgather_into_tensor_coalesced_.default: c10d._allgather_base_.default,
                 c10d.reduce_scatter_tensor_coalesced_.default: c10d._reduce_scatter_base_.default}
    point_to_point = {c10d.send.default, c10d.recv_.default}
    factories = {aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default,
                 aten.zeros.default, aten.ones.default, aten.scalar_tensor.default}
    like_factories = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                      aten.new_zeros.default, aten.new_ones.default, aten.new_full.default}
    device_of = torch.ops.prim.device.default
    literals = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
    writes: dict[Any, list[int]] = {}

    def written(func: Any) -> list[int]:
        if func not in writes:
            writes[func] = [i for i, a in enumerate(func._schema.arguments)
                            if a.alias_info is not None and a.alias_info.is_write]
        return writes[func]

    class _Answers(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # nothing is compiled in the estimate: no torch._dynamo.disable wrapper per dispatched op

        def __init__(self) -> None:
            super().__init__()
            self.asked: Counter[tuple[str, str, str]] = Counter()
            self.groups: set[tuple[int, ...]] = set()
            self.peers: set[int] = set()
            self.p2p_groups: set[tuple[int, ...]] = set()
            self.shadows = Shadows()

        def _group(self, func: Any, args: tuple) -> Any:
            if func in coalesced:
                return ProcessGroup.unbox(args[2])
            if func is c10d.allreduce_coalesced_.default:
                return ProcessGroup.unbox(args[1])
            return CollectiveOp.get_process_group(func, args)

        def _record_group(self, func: Any, args: tuple) -> Any:
            try:
                group = self._group(func, args)
                ranks = tuple(dist.get_process_group_ranks(group))
            except (TypeError, ValueError, RuntimeError, IndexError):
                return None
            if func in point_to_point:  # torch_npu gives each peer its own point-to-point communicator
                if len(args) > 2 and isinstance(args[2], int) and args[2] < len(ranks):
                    self.peers.add(ranks[args[2]])
                    self.p2p_groups.add(ranks)
            elif len(ranks) > 1:
                self.groups.add(ranks)
            return group

        def _answer(self, question: str, value: Any) -> Any:
            self.asked[(question, repr(value), _caller())] += 1
            return value

        def _real(self, func: Any, real_args: tuple, real_kwargs: dict) -> Any:
            with unset_fake_temporarily():
                return func(*real_args, **real_kwargs)

        def _collective(self, func: Any, args: tuple, group: Any) -> None:
            """Shadow a collective's output from its input's shadow (every rank holding the same)."""
            s = self.shadows
            if group is None:
                return
            n, r = group.size(), group.rank()
            if func is c10d._allgather_base_.default and s.get(args[1]) is not None:
                s.set(args[0], collective_shadow("all_gather", s.get(args[1]), n, r).reshape(args[0].shape))
            elif func is c10d.allreduce_.default:
                try:  # c10d's ReduceOp script object: op() is torch.distributed.ReduceOp.RedOpType's value
                    op = {0: "sum", 1: "avg", 3: "min", 4: "max"}.get(int(args[2].op()), "other")
                except (AttributeError, RuntimeError, TypeError):
                    op = "other"
                for t in args[0]:
                    real = s.get(t)
                    if real is not None and op in ("sum", "max", "min", "avg"):
                        real.copy_(collective_shadow("all_reduce", real, n, r, op=op))
                    else:
                        s.drop(t)
            elif func is c10d.alltoall_base_.default and s.get(args[1]) is not None:
                real = collective_shadow("all_to_all", s.get(args[1]), n, r, (list(args[3]), list(args[4])))
                s.set(args[0], real.reshape(args[0].shape))
            elif func is not c10d.broadcast_.default:
                for i in written(func):
                    for t in tree_leaves(args[i]) if i < len(args) else []:
                        s.drop(t)

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func is device_of:  # a tensor's .device: metadata, answered as FakeTensor answers it outside its kernels
                t = args[0]
                if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
                    return t.fake_device
                return func(*args)
            kwargs = kwargs or {}
            leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            fakes = [t for t in leaves if isinstance(t, FakeTensor)]
            if leaves and not fakes and func not in literals:
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            s = self.shadows
            if func in collective_ops or func in coalesced or func is c10d.allreduce_coalesced_.default:
                group = self._record_group(func, args)
                if func in coalesced:
                    single, work = coalesced[func], None
                    for out, inp in zip(args[0], args[1]):
                        _, work = single(out, inp, *args[2:], **kwargs)
                        s.drop(out)
                    return work
                if func is c10d.allreduce_coalesced_.default:
                    tensors, pg, op = args[:3]
                    for t in tensors:
                        s.drop(t)
                    return c10d.allreduce_.default(list(tensors), pg, op, None, *args[3:], **kwargs)[1]
                out = func(*args, **kwargs)
                with unset_fake_temporarily():
                    self._collective(func, args, group)
                return out
            if func is aten._local_scalar_dense.default:
                real = s.get(args[0])
                if real is not None:
                    with unset_fake_temporarily():
                        return real.item()
                dtype = args[0].dtype
                value: Any = False if dtype is torch.bool else 0.0 if dtype.is_floating_point else 0
                return self._answer(f".item() of a {str(dtype).replace('torch.', '')} tensor", value)
            # the real inputs exist only when every fake input has a shadow (most ops: none has one)
            shadowed = bool(fakes) and all(s.get(t) is not None for t in fakes)
            real_inputs = s.real_args(args, kwargs) if shadowed else None
            if func is aten.equal.default:
                if real_inputs is not None:
                    return self._real(func, *real_inputs)
                return self._answer("torch.equal", True)
            try:
                out = func(*args, **kwargs)
            except (DynamicOutputShapeException, DataDependentOutputException):
                mask = s.get(args[1]) if func is aten.masked_select.default else None
                if real_inputs is None and mask is not None:  # the shape is the mask's count
                    with unset_fake_temporarily():
                        count = int(mask.expand(args[0].shape).sum())
                    return torch.empty(count, dtype=args[0].dtype, device=args[0].device)
                if real_inputs is None:
                    raise
                real_out = self._real(func, *real_inputs)
                out = tree_map_only(torch.Tensor, lambda r: torch.empty_strided(
                    r.shape, r.stride(), dtype=r.dtype, device=fakes[0].device), real_out)
                s.attach(out, real_out)
                return out
            if real_inputs is not None:
                s.attach(out, self._real(func, *real_inputs))
            elif func in literals:
                with unset_fake_temporarily():
                    s.set(out, args[0].clone())
            elif func in factories or func in like_factories:
                fake_out = out
                if isinstance(fake_out, torch.Tensor) and fake_out.numel() <= (1 << 22):
                    def concrete(x: Any) -> Any:
                        return torch.empty(x.shape, dtype=x.dtype) if isinstance(x, FakeTensor) else x
                    with unset_fake_temporarily():
                        real_args, real_kwargs = tree_map_only(torch.Tensor, concrete, (args, kwargs))
                        if "device" in real_kwargs:
                            real_kwargs["device"] = "cpu"
                        s.set(fake_out, func(*real_args, **real_kwargs))
            elif func is aten.topk.default and fakes:
                indices = out[1]
                k, dim = args[1], args[2] if len(args) > 2 else kwargs.get("dim", -1)
                with unset_fake_temporarily():
                    s.set(indices, balanced_topk(tuple(indices.shape), k, args[0].shape[dim], dim))
                self._answer("topk over scores nobody knows (MoE routing)", "even: tokens x k / experts each")
            else:
                for i in written(func):
                    for t in tree_leaves(args[i]) if i < len(args) else []:
                        s.drop(t)
            return out

    return _Answers


_MODE_CLASS: type | None = None


def Answers() -> Any:  # noqa: N802 (a factory that reads like the class it makes: torch is imported late)
    """A new answering mode (enter it inside a ``FakeTensorMode``)."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        _MODE_CLASS = _make_mode_class()
    return _MODE_CLASS()
