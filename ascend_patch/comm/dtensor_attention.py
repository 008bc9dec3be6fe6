"""Scaled dot-product attention on sharded DTensors off CUDA.

``F.scaled_dot_product_attention`` on DTensors (tensor parallelism shards q/k/v on the head
dimension, data parallelism on the batch) reaches DTensor as the kernel the device picked.
torch 2.13 gives sharding strategies to CUDA's kernels only (flash, efficient, cudnn), so:

* on the cpu target SDPA runs ``_scaled_dot_product_flash_attention_for_cpu`` and pytorch/examples'
  ``fsdp_tp_example.py`` stops with "Operator aten._scaled_dot_product_flash_attention_for_cpu.default
  does not have a sharding strategy registered";
* an accelerator plugged in as PrivateUse1 with its own kernel (torch_npu's ``npu``, when its
  backend choice says so) runs ``_scaled_dot_product_fused_attention_overrideable``: no strategy;
* the math decomposition (the cpu target with ``dropout_p > 0``; a device with no fused kernel)
  builds the causal mask as a plain tensor: "got mixed torch.Tensor and DTensor".

Here both kernels and their backwards get the strategies torch gives CUDA's flash attention:
everything replicated, or q/k/v/outputs sharded on the head dimension (1), or on the batch (0).
Attention is independent per batch element and per head, so each rank's result is its slice
of the unsharded one. They are served through an overlay of the sharding propagator's strategy
table: lookups see them, registrations made meanwhile go to torch's own table, and ``remove()``
puts that table back. SDPA called with DTensors runs under DTensor's ``implicit_replication``,
so the math path's own mask (and a plain ``attn_mask``) counts as replicated.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from ..patch import Action, Patch, Replace, replacing

__all__ = ["StrategyOverlay", "attention_strategies", "dtensor_attention_patches"]

_TORCH = {"package": "torch", "versions": ">=2.13,<2.14"}  # DTensor's propagator internals as measured
_PROPAGATOR = "torch.distributed.tensor._api:DTensor._op_dispatcher.sharding_propagator"


class StrategyOverlay(MutableMapping):
    """torch's strategy table with some entries added in front; every write goes to torch's table."""

    def __init__(self, base: MutableMapping, added: dict) -> None:
        self.base, self.added = base, dict(added)

    def __getitem__(self, op: Any) -> Any:
        return self.added[op] if op in self.added else self.base[op]

    def __setitem__(self, op: Any, strategy: Any) -> None:
        self.added.pop(op, None)  # a strategy registered by torch or the program wins over ours
        self.base[op] = strategy

    def __delitem__(self, op: Any) -> None:
        if op in self.added:
            del self.added[op]
        else:
            del self.base[op]

    def __iter__(self) -> Iterator[Any]:
        yield from self.added
        yield from (op for op in self.base if op not in self.added)

    def __len__(self) -> int:
        return len(self.base) + sum(1 for op in self.added if op not in self.base)

    def __contains__(self, op: object) -> bool:
        return op in self.added or op in self.base


def _mask_placement(strategy: Any, dim: int) -> Any:
    """How a 4-D mask/bias follows q sharded on ``dim``: sharded where it has that dimension, else replicated."""
    from torch.distributed.tensor import Replicate, Shard

    shape = strategy.shape
    return Shard(dim) if len(shape) == 4 and shape[dim] > 1 else Replicate()


def _expand(op_schema: Any, outputs: int, rows: list[list[Any]], backward: bool) -> Any:
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    mesh = op_schema.get_mesh_from_args(validate=not backward)
    return expand_to_full_mesh_op_strategy(mesh, op_schema, rows, input_index=outputs)


def _rows(n_outputs: list[str], n_inputs: int, mask: Any) -> list[list[Any]]:
    """Replicate / heads (Shard(1)) / batch (Shard(0)) rows: ``n_outputs`` marks outputs ('t' tensor,
    'r' replicated tensor, '-' none); ``n_inputs`` sharded tensor inputs, then the mask if any."""
    from torch.distributed.tensor import Replicate, Shard

    rows = []
    for place in (None, Shard(1), Shard(0)):
        out = [None if kind == "-" else (Replicate() if place is None or kind == "r" else place)
               for kind in n_outputs]
        ins = [Replicate() if place is None else place] * n_inputs
        extra = [] if mask is None else [Replicate() if place is None else _mask_placement(mask, place.dim)]
        rows.append(out + ins + extra)
    return rows


def _cpu_flash(op_schema: Any) -> Any:
    # (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
    mask = op_schema.kwargs_schema.get("attn_mask")
    return _expand(op_schema, 2, _rows(["t", "t"], 3, mask if _is_strategy(mask) else None), backward=False)


def _cpu_flash_backward(op_schema: Any) -> Any:
    # (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale) -> (dq, dk, dv)
    mask = op_schema.kwargs_schema.get("attn_mask")
    return _expand(op_schema, 3, _rows(["t", "t", "t"], 6, mask if _is_strategy(mask) else None), backward=True)


def _overrideable(op_schema: Any) -> Any:
    # (query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask, *, scale) -> (output, logsumexp,
    # cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_attn_mask)
    bias = op_schema.args_schema[3] if len(op_schema.args_schema) > 3 else None
    # as torch's meta kernel says: cum_seq_q/k and the debug mask undefined, 0-d philox seed and offset
    kinds = ["t", "t", "-", "-", "-", "-", "r", "r", "-"]
    return _expand(op_schema, 9, _rows(kinds, 3, bias if _is_strategy(bias) else None), backward=False)


def _overrideable_backward(op_schema: Any) -> Any:
    # (grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
    # max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale) -> (dq, dk, dv, d_attn_bias)
    from torch.distributed.tensor import Replicate, Shard

    args = op_schema.args_schema
    bias = args[4] if _is_strategy(args[4]) else None
    tensors = [i for i, a in enumerate(args) if _is_strategy(a)]
    rows = []
    for place in (Replicate(), Shard(1), Shard(0)):
        bias_place = None if bias is None else (
            Replicate() if isinstance(place, Replicate) else _mask_placement(bias, place.dim))
        ins = [bias_place if i == 4 else place if i in (0, 1, 2, 3, 6, 7) else Replicate()  # cum_seq, philox
               for i in tensors]
        rows.append([place, place, place, bias_place] + ins)
    return _expand(op_schema, 4, rows, backward=True)


def _is_strategy(value: Any) -> bool:
    from torch.distributed.tensor._op_schema import OpStrategy

    return isinstance(value, OpStrategy)


def attention_strategies() -> dict[Any, Callable[[Any], Any]]:
    """The attention kernels SDPA reaches off CUDA -> their sharding strategy functions."""
    import torch

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu.default: _cpu_flash,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _cpu_flash_backward,
            aten._scaled_dot_product_fused_attention_overrideable.default: _overrideable,
            aten._scaled_dot_product_fused_attention_overrideable_backward.default: _overrideable_backward}


def _overlay(original: Any) -> Any:
    return StrategyOverlay(original, attention_strategies())


def _sdpa(original: Any) -> Any:
    @replacing(original)
    def scaled_dot_product_attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        api = sys.modules.get("torch.distributed.tensor._api")
        if api is None or not isinstance(query, api.DTensor):
            return original(query, key, value, *args, **kwargs)
        from torch.distributed.tensor.experimental import implicit_replication

        with implicit_replication():  # the math path's causal mask, a plain attn_mask: replicated
            return original(query, key, value, *args, **kwargs)

    return scaled_dot_product_attention


def dtensor_attention_patches() -> list[Patch]:
    """SDPA on sharded DTensors: strategies for the cpu and PrivateUse1 kernels, the math path's mask replicated."""
    return [
        Replace(f"{_PROPAGATOR}.op_strategy_funcs",
                "DTensor sharding strategies (replicate / heads / batch) for _scaled_dot_product_flash_attention_for_cpu "
                "and _scaled_dot_product_fused_attention_overrideable, which torch gives CUDA's kernels only",
                make=_overlay, action=Action.EMULATED, count_calls=False, rebind=False, **_TORCH),
        Replace("torch.nn.functional:scaled_dot_product_attention",
                "with DTensor arguments, runs under implicit_replication: the math path's plain causal mask "
                "(dropout_p > 0 on the host) is replicated instead of refused", make=_sdpa,
                action=Action.EMULATED, count_calls=False, **_TORCH),
    ]
