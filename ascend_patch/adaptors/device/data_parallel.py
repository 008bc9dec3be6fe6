"""``nn.DataParallel`` over the cpu target's virtual devices gives the numbers of N GPUs.

``torch.cuda.device_count()`` is N on the cpu target (see :func:`cpu_host.visible_count`),
so code written for one node with N GPUs wraps its model in ``DataParallel`` and then
reads the result as N replicas' (Hugging Face Trainer: ``n_gpu = device_count()``,
``loss.mean()``). DataParallel therefore does here what it does on N GPUs, one replica
after the other on the host:

* the inputs are scattered into ``len(device_ids)`` chunks along ``dim`` (``torch.chunk``,
  as torch's scatter does; objects that are not tensors are given to every replica);
* each chunk runs the module; the replicas share the module's parameters, so the
  gradients are the sum over the chunks (what the replicas' gradients reduced into the
  module are);
* buffers follow DataParallel's documentation: in-place updates made in ``forward``
  survive only from ``device_ids[0]``'s replica (the others run on copies), and no
  attribute the forward assigns survives;
* the outputs are gathered along ``dim``; a scalar per replica becomes a vector of N.

One device id (or none) runs the module directly, as torch does.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ...backend import Backend
from ...cpu_host import CPU_DEVICES, device_source
from ...devices import DeviceMap
from ...patch import Action, Patch, Replace, replacing
from ...usage import note

__all__ = ["data_parallel_patches", "gather", "scatter"]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(obj: Any, n: int, dim: int = 0) -> list[Any]:
    """``obj`` split into at most ``n`` pieces with the structure torch's ``scatter`` gives."""
    if isinstance(obj, torch.Tensor):
        return list(obj.chunk(n, dim))
    if _is_namedtuple(obj):
        return [type(obj)(*args) for args in zip(*(scatter(o, n, dim) for o in obj))]
    if isinstance(obj, tuple) and obj:
        return list(zip(*(scatter(o, n, dim) for o in obj)))
    if isinstance(obj, list) and obj:
        return [list(i) for i in zip(*(scatter(o, n, dim) for o in obj))]
    if isinstance(obj, dict) and obj:
        return [type(obj)(i) for i in zip(*(scatter(item, n, dim) for item in obj.items()))]
    return [obj for _ in range(n)]


def gather(outputs: list[Any], dim: int = 0) -> Any:
    """The replicas' outputs joined along ``dim`` as torch's ``gather`` joins them."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        if all(t.dim() == 0 for t in outputs):
            warnings.warn("Was asked to gather along dimension 0, but all input tensors were scalars; "
                          "will instead unsqueeze and return a vector.", stacklevel=3)
            return torch.stack(list(outputs))
        return torch.cat(list(outputs), dim)
    if out is None:
        return None
    if isinstance(out, dict):
        if not all(len(out) == len(d) for d in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(out)((k, gather([d[k] for d in outputs], dim)) for k in out)
    if _is_namedtuple(out):
        return type(out)._make(map(lambda parts: gather(list(parts), dim), zip(*outputs)))
    return type(out)(map(lambda parts: gather(list(parts), dim), zip(*outputs)))


def _index(device: Any, dmap: DeviceMap) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "cuda":
        return 0 if device.index is None else device.index
    raise ValueError(f"DataParallel device {device!r} is not a CUDA device; give indices or 'cuda:N'")


def _init(original: Any, target: Backend, dmap: DeviceMap) -> Any:
    @replacing(original)
    def __init__(self: Any, module: nn.Module, device_ids: Any = None, output_device: Any = None,
                 dim: int = 0) -> None:
        nn.Module.__init__(self)
        torch._C._log_api_usage_once("torch.nn.parallel.DataParallel")
        dm = target.device_module
        count = dm.device_count()
        self.module = module
        self.dim = dim
        ids = list(range(count)) if device_ids is None else [_index(d, dmap) for d in device_ids]
        for i in ids:
            if not 0 <= i < count:
                raise ValueError(
                    f"DataParallel(device_ids={list(device_ids or ids)}): device {i} does not exist; the cpu "
                    f"target has {count} virtual device(s) ({device_source()[1]}); give ids below that or "
                    f"set {CPU_DEVICES}=N")
        self.device_ids = ids
        self.output_device = _index(output_device, dmap) if output_device is not None else (ids[0] if ids else None)
        self.src_device_obj = torch.device(target.device_type)
        if ids:
            note("nn.DataParallel", Action.EMULATED.value)

    return __init__


def _replica_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A replica's buffers: copies, so that its in-place updates do not reach the module."""
    return {name: b.clone() for name, b in module.named_buffers()}


def _forward(original: Any) -> Any:
    from torch.func import functional_call

    @replacing(original)
    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if len(self.device_ids) < 2:
            return self.module(*inputs, **kwargs)
        n = len(self.device_ids)
        chunks = scatter(inputs, n, self.dim) if inputs else []
        kw_chunks = scatter(kwargs, n, self.dim) if kwargs else []
        replicas = max(len(chunks), len(kw_chunks), 1)  # a batch smaller than N uses fewer replicas
        chunks += [() for _ in range(replicas - len(chunks))]
        kw_chunks += [{} for _ in range(replicas - len(kw_chunks))]
        outputs = []
        for i, (args, kw) in enumerate(zip(chunks, kw_chunks)):
            # device_ids[0]'s replica holds the module's own buffers; a replica is a separate module
            # object, so what a forward assigns to attributes is lost for every replica alike
            state = dict(self.module.named_buffers()) if i == 0 else _replica_state(self.module)
            outputs.append(functional_call(self.module, state, tuple(args), dict(kw), strict=False,
                                           tie_weights=True))
        return gather(outputs, self.dim)

    return forward


def _functional(original: Any) -> Any:
    @replacing(original)
    def data_parallel(module: nn.Module, inputs: Any, device_ids: Any = None, output_device: Any = None,
                      dim: int = 0, module_kwargs: Any = None) -> Any:
        if not isinstance(inputs, tuple):
            inputs = (inputs,) if inputs is not None else ()
        # the functional form is one DataParallel call (torch's runs the same scatter/replicate/gather)
        wrapper = nn.DataParallel(module, device_ids=device_ids, output_device=output_device, dim=dim)
        return wrapper(*inputs, **(module_kwargs or {}))

    return data_parallel


def data_parallel_patches(target: Backend, dmap: DeviceMap) -> list[Patch]:
    """On cpu, DataParallel scatters over the virtual devices; on npu torch's own runs on the NPUs."""
    if target.name != "cpu":
        return []
    where = "torch.nn.parallel.data_parallel:DataParallel"
    return [
        Replace(f"{where}.__init__", "device_ids default to every virtual device (torch.cuda.device_count())",
                make=lambda orig: _init(orig, target, dmap), action=Action.EMULATED, count_calls=False,
                backends=frozenset({"cpu"})),
        Replace(f"{where}.forward",
                "scatter over the virtual devices, one replica after another, gather: the numbers of N GPUs",
                make=_forward, action=Action.EMULATED, count_calls=False, backends=frozenset({"cpu"})),
        Replace("torch.nn.parallel.data_parallel:data_parallel", "the functional form is one DataParallel call",
                make=_functional, action=Action.EMULATED, count_calls=False, backends=frozenset({"cpu"})),
    ]
