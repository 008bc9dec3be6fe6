"""One rank of a large job, simulated in this process: torch's fake process group and fake tensors.

:func:`simulated_rank` makes this process rank ``r`` of a ``world_size``-rank job
(``torch.testing._internal.distributed.fake_pg``: every collective is accepted and moves
nothing) and :func:`fake_device` makes every tensor the job creates a ``FakeTensor`` (shapes,
dtypes and storages, no data), so Megatron's own code builds and steps an 8B model at no
host-memory cost. Five things a fake rank cannot do by itself are done here, each for a
stated reason:

* gloo side groups: Megatron creates CPU (gloo) groups next to the device ones, and a gloo
  group cannot be made over the fake store. They carry no device memory; they become fake
  groups too (``new_group``).
* sends: a fake send is done at once; its work keeps the sent tensors until waited on, as
  NCCL/HCCL keep them from reuse until the send is done (:class:`_HeldWork`).
* ``all_gather_object``: a fake collective returns no object. Every rank is assumed to hold
  what this one holds (Megatron gathers parameter-group keys, which are the same on all
  ranks of a layout).
* ``nn.Module.to`` / ``.cuda()`` of a module whose parameters are fake: torch swaps fake
  parameters, and a swap refuses tensors with weak references, which every fake tensor has;
  the parameter's data is set instead (what torch did for real tensors before swapping).
* value-dependent questions (``.item()``, ``.tolist()``, ``torch.equal``): answered by
  :mod:`.answers` from the values it knows (:mod:`.shadows`), or with the answer of an
  ordinary step, which it records so the report can state it.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

from .answers import Answers

__all__ = ["fake_device", "simulated_rank"]

class _HeldWork:
    """A fake send's work that keeps the sent tensors until it is waited on.

    NCCL and HCCL keep a sent tensor's memory from reuse until the send is done (ProcessGroupNCCL
    stashes it until the work is waited on); a fake send is done at once, which would free the
    memory of pipeline outputs Megatron deallocates right after sending them.
    """

    def __init__(self, work: Any, tensors: list[Any]) -> None:
        self._work, self._tensors = work, tensors

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._tensors = []
        return self._work.wait(*args, **kwargs) if self._work is not None else True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@contextlib.contextmanager
def simulated_rank(world_size: int, rank: int, nproc_per_node: int | None = None) -> Iterator[None]:
    """This process is ``rank`` of ``world_size`` on torch's fake process group (and torchrun's variables say so)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    per_node = nproc_per_node or world_size
    saved_env = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % per_node),
                      LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    original = {"new_group": dist.new_group, "all_gather_object": dist.all_gather_object,
                "broadcast_object_list": dist.broadcast_object_list, "isend": dist.isend,
                "batch_isend_irecv": dist.batch_isend_irecv}

    def new_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") is not None:  # gloo (or an explicit device backend): the fake one
            kwargs["backend"] = "fake"
        return original["new_group"](*args, **kwargs)

    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        for i in range(len(object_list)):
            object_list[i] = copy.deepcopy(obj)

    def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None, **_: Any) -> None:
        return None  # the source is assumed to hold what this rank holds

    def isend(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return _HeldWork(original["isend"](tensor, *args, **kwargs), [tensor])

    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        sent = [op.tensor for op in p2p_op_list if op.op in (dist.isend, isend)]
        works = original["batch_isend_irecv"](p2p_op_list)
        return [_HeldWork(w, sent) for w in works] if works else works

    replaced = {"new_group": new_group, "all_gather_object": all_gather_object,
                "broadcast_object_list": broadcast_object_list, "isend": isend,
                "batch_isend_irecv": batch_isend_irecv}
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    for name, value in replaced.items():
        setattr(dist, name, value)
        setattr(c10d, name, value)
    try:
        yield
    finally:
        for name, value in original.items():
            setattr(dist, name, value)
            setattr(c10d, name, value)
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _apply_setting_data(original: Any) -> Any:
    """``nn.Module._apply`` that keeps fake parameters in place (sets ``.data``) instead of swapping them."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    def _apply(self: Any, fn: Any, recurse: bool = True) -> Any:
        if not any(isinstance(p, FakeTensor) for p in self.parameters(recurse=recurse)):
            return original(self, fn, recurse)
        if recurse:
            for child in self.children():
                child._apply(fn)
        for param in self._parameters.values():
            if param is None:
                continue
            with torch.no_grad():
                converted = fn(param)
            if converted is not param:
                param.data = converted
            if param.grad is not None:
                grad = fn(param.grad)
                if grad is not param.grad:
                    param.grad = grad
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    return _apply


def _values(name: str, answers: Any, cls: Any) -> Any:
    """``cls.<name>`` (``tolist``, ``numpy``) that reads a fake tensor's shadow (:mod:`.shadows`) at once.

    ``FakeTensor.tolist`` itself iterates: one ``select`` and one ``.item()`` per element, each
    dispatched through every mode (MoE dispatchers call it on routing tables of experts x ranks,
    twice per layer and pass); the shadow's own ``tolist`` gives the same values in one call.
    """
    import numpy as np
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    original = getattr(cls, name)

    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(self, FakeTensor):
            return original(self, *args, **kwargs)
        real = answers.shadows.get(self)
        with unset_fake_temporarily():
            if real is None:
                answers._answer(f".{name}() of a tensor whose values are unknown", "zeros")
                real = torch.zeros(self.shape, dtype=self.dtype)
            return getattr(real, name)(*args, **kwargs) if name != "numpy" else np.asarray(real.numpy())

    return read


@contextlib.contextmanager
def fake_device(answers: Any = None) -> Iterator[Any]:
    """Every tensor made inside is fake; value-dependent questions are answered (and recorded) by ``answers``."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    answers = answers if answers is not None else Answers()
    original_apply = torch.nn.Module._apply
    torch.nn.Module._apply = _apply_setting_data(original_apply)  # type: ignore[method-assign]
    # torch.Tensor's methods, and FakeTensor's own where it overrides them (its tolist does)
    own = {(cls, name): cls.__dict__.get(name) for cls in (torch.Tensor, FakeTensor) for name in ("tolist", "numpy")
           if cls is torch.Tensor or name in cls.__dict__}
    for cls, name in own:
        setattr(cls, name, _values(name, answers, cls))
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), answers:
            yield answers
    finally:
        torch.nn.Module._apply = original_apply  # type: ignore[method-assign]
        for (cls, name), saved in own.items():
            if saved is not None:
                setattr(cls, name, saved)
            else:
                delattr(cls, name)
