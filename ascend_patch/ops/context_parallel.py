"""Context-parallel attention on Megatron's load-balanced sequence split, for each ``--cp-comm-type``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..backend import current_target
from .attention_block import block_backward, block_forward, merge
from .attention_npu import compressed_causal_mask, npu_supports

__all__ = ["COMM_TYPES", "all_gather_sequence", "attend", "context_parallel_attention", "load_balanced_chunks"]

COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


def load_balanced_chunks(rank: int, world: int) -> tuple[int, int]:
    """The two chunks (of 2 x world) Megatron gives CP rank ``rank``."""
    return rank, 2 * world - 1 - rank


# -- plain attention (the blocks of all_gather and a2a) ---------------------------------------

def _npu_attend(kernel: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, dropout: float) -> Tensor:
    # BSND; rightDownCausal = bottom-right aligned, the compressed 2048x2048 mask
    mask = compressed_causal_mask(q.device) if causal else None
    out = kernel(q.contiguous(), k.contiguous(), v.contiguous(), q.shape[2], "BSND", atten_mask=mask, scale=scale,
                 keep_prob=1.0 - dropout, sparse_mode=3 if causal else 0)
    return out[0]


def _torch_attend(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, dropout: float) -> Tensor:
    # SDPA wants (b, heads, s, d); its is_causal is top-left aligned, so give bottom-right as a mask
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sq, sk = q.shape[2], k.shape[2]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq) if causal and sq != sk else None
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal and sq == sk, scale=scale,
        enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2)


def attend(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, dropout: float = 0.0) -> Tensor:
    """Attention of q (b, sq, h, d) over k, v (b, sk, g, d); causal is bottom-right aligned.

    On ``npu_fusion_attention`` where the current target has it and the shapes are within its limits, else SDPA.
    """
    return _attend(q, k, v, causal, scale, dropout, current_target().kernels)


def _attend(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, dropout: float, kernels: Any) -> Tensor:
    kernel = kernels.get("npu_fusion_attention")
    if kernel is not None and npu_supports(q, k):
        return _npu_attend(kernel, q, k, v, causal, scale, dropout)
    return _torch_attend(q, k, v, causal, scale, dropout)


# -- all_gather ---------------------------------------------------------------------------

class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; the backward reduce-scatters (sums) the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        out = torch.empty((world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        world = dist.get_world_size(ctx.group)
        out = torch.empty((grad.shape[0] // world, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_gather_sequence(tensor: Tensor, group: Any) -> Tensor:
    """``tensor`` [s_local, ...] gathered over ``group`` and put back in global sequence order."""
    world = dist.get_world_size(group)
    chunks = _GatherSequence.apply(tensor, group).chunk(2 * world, dim=0)  # rank-major
    order: list[Tensor] = [chunks[0]] * (2 * world)
    for rank in range(world):
        first, second = load_balanced_chunks(rank, world)
        order[first], order[second] = chunks[2 * rank], chunks[2 * rank + 1]
    return torch.cat(order, dim=0)


def _all_gather_attention(q: Tensor, k: Tensor, v: Tensor, group: Any, causal: bool, scale: float, dropout: float,
                          kernels: Any) -> Tensor:
    """``all_gather``: K and V are all-gathered (gradients reduce-scattered) and put in sequence order; each
    local query chunk attends the prefix it may see."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    k = all_gather_sequence(k.transpose(0, 1), group).transpose(0, 1)
    v = all_gather_sequence(v.transpose(0, 1), group).transpose(0, 1)
    chunk = q.shape[1] // 2
    parts = []
    for local, index in enumerate(load_balanced_chunks(rank, world)):
        end = (index + 1) * chunk if causal else k.shape[1]
        parts.append(_attend(q[:, local * chunk:(local + 1) * chunk], k[:, :end], v[:, :end], causal, scale, dropout,
                             kernels))
    return torch.cat(parts, dim=1)


# -- a2a ----------------------------------------------------------------------------------

class _AllToAll(torch.autograd.Function):
    """Split dim ``scatter`` into ``world`` parts, send part j to rank j, concatenate received parts on ``gather``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, scatter: int, gather: int) -> Tensor:
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return _all_to_all(x, group, scatter, gather)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _all_to_all(grad, ctx.group, ctx.gather, ctx.scatter), None, None, None


def _all_to_all(x: Tensor, group: Any, scatter: int, gather: int) -> Tensor:
    world = dist.get_world_size(group)
    send = torch.stack(x.chunk(world, dim=scatter), dim=0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather)


def _check_heads(comm_type: str, q: Tensor, k: Tensor, size: int) -> None:
    for label, heads in (("query heads", q.shape[2]), ("key/value heads (query groups)", k.shape[2])):
        if heads % size:
            raise ValueError(f"cp_comm_type={comm_type!r} splits heads over {size} ranks, but this rank has {heads} "
                             f"{label} (after tensor parallelism); use a number of heads (and --num-query-groups) "
                             f"divisible by {size} x TP, or --cp-comm-type p2p / all_gather")


def _sequence_order(chunks: Sequence[int]) -> list[int]:
    """Positions that sort ``chunks`` (chunk ids as held) into sequence order."""
    return sorted(range(len(chunks)), key=lambda i: chunks[i])


def _reorder(x: Tensor, order: Sequence[int], parts: int) -> Tensor:
    pieces = x.chunk(parts, dim=1)
    return torch.cat([pieces[i] for i in order], dim=1)


def _a2a_attention(q: Tensor, k: Tensor, v: Tensor, group: Any, chunks: Sequence[int], causal: bool, scale: float,
                   dropout: float, kernels: Any) -> Tensor:
    """``a2a`` (Ulysses) over ``group``: ``chunks`` are the chunk ids the gathered sequence holds (rank-major).

    An all-to-all trades the head split for the sequence split (every rank gets the whole sequence for
    heads/CP heads, so query and key/value heads must both divide by CP), attention runs on the whole
    sequence, a second all-to-all trades back.
    """
    q, k, v = (_AllToAll.apply(t, group, 2, 1) for t in (q, k, v))
    order = _sequence_order(chunks)
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    q, k, v = (_reorder(t, order, len(chunks)) for t in (q, k, v))
    out = _attend(q, k, v, causal, scale, dropout, kernels)
    return _AllToAll.apply(_reorder(out, inverse, len(chunks)), group, 1, 2)


# -- p2p ring -----------------------------------------------------------------------------

class _Exchange:
    """Send a tensor to the next rank of the ring and receive the previous rank's; ``wait()`` returns it.

    Started before a step's attention and awaited after it, so the transfer overlaps the compute.
    """

    def __init__(self, tensor: Tensor, group: Any) -> None:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        nxt, prev = dist.get_global_rank(group, (rank + 1) % world), dist.get_global_rank(group, (rank - 1) % world)
        self._send = tensor.contiguous()
        self._recv = torch.empty_like(self._send)
        self._reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, self._send, nxt, group),
                                             dist.P2POp(dist.irecv, self._recv, prev, group)])

    def wait(self) -> Tensor:
        for req in self._reqs:
            req.wait()
        return self._recv


def _visible(q_chunk: int, kv_chunks: Sequence[int], causal: bool) -> tuple[list[int], bool]:
    """Positions of the key chunks ``q_chunk`` may see (sequence order), and whether its own chunk is among them."""
    pos = sorted((i for i, c in enumerate(kv_chunks) if not causal or c <= q_chunk), key=lambda i: kv_chunks[i])
    return pos, causal and q_chunk in kv_chunks


def _slots(x: Tensor, positions: Sequence[int], chunk: int) -> Tensor:
    return torch.cat([x[:, i * chunk:(i + 1) * chunk] for i in positions], dim=1)


class _Ring(torch.autograd.Function):
    """``p2p``: ring attention. K/V blocks travel around the ring (sent to the next rank, received from the
    previous one); each step attends the local query chunks to the visible chunks of the block that is here
    and merges the partial outputs by log-sum-exp (:mod:`.attention_block`). The backward pass runs the ring
    again, each K/V block travelling with its gradient until it is back with its owner, so no rank ever
    holds more than two K/V blocks."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, group: Any, layout: tuple[tuple[int, ...], ...],
                causal: bool, scale: float, dropout: float, kernels: Any) -> Tensor:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        mine = layout[rank]
        chunk = q.shape[1] // len(mine)
        dk = k.shape[-1]
        kv = torch.cat([k, v], dim=-1)
        outs: list[Any] = [None] * len(mine)
        lses: list[Any] = [None] * len(mine)
        states: dict[tuple[int, int], Any] = {}
        for step in range(world):
            src = (rank - step) % world
            incoming = _Exchange(kv, group) if step < world - 1 else None
            for i, g in enumerate(mine):
                pos, diag = _visible(g, layout[src], causal)
                if not pos:
                    continue
                block = _slots(kv, pos, chunk)
                res = block_forward(q[:, i * chunk:(i + 1) * chunk], block[..., :dk], block[..., dk:], causal=diag,
                                    scale=scale, dropout=dropout, kernels=kernels)
                states[(step, i)] = res.state
                outs[i], lses[i] = merge(outs[i], lses[i], res.out, res.lse)
            if incoming is not None:
                kv = incoming.wait()
        out = torch.cat(outs, dim=1).to(q.dtype)
        lse = torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, layout, causal, scale, dropout, kernels, states)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        group, layout, causal, scale, dropout, kernels, states = ctx.args
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        mine = layout[rank]
        chunk = q.shape[1] // len(mine)
        dk = k.shape[-1]
        kv = torch.cat([k, v], dim=-1)
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for step in range(world):
            src = (rank - step) % world
            for i, g in enumerate(mine):
                pos, diag = _visible(g, layout[src], causal)
                if not pos:
                    continue
                rows = slice(i * chunk, (i + 1) * chunk)
                block = _slots(kv, pos, chunk)
                gq, gk, gv = block_backward(q[:, rows], block[..., :dk], block[..., dk:], out[:, rows], dout[:, rows],
                                            lse[:, :, rows], causal=diag, scale=scale, dropout=dropout,
                                            state=states.get((step, i)), kernels=kernels)
                dq[:, rows] += gq.float()
                grad = torch.cat([gk.float(), gv.float()], dim=-1)
                for n, p in enumerate(pos):
                    dkv[:, p * chunk:(p + 1) * chunk] += grad[:, n * chunk:(n + 1) * chunk]
            # the gradient travels with its block; after `world` hops it is back with the owner
            if step < world - 1:
                both = _Exchange(torch.cat([kv.float(), dkv], dim=-1), group).wait()
                kv, dkv = both[..., :kv.shape[-1]].to(k.dtype), both[..., kv.shape[-1]:]
            else:
                dkv = _Exchange(dkv, group).wait()
        return (dq.to(q.dtype), dkv[..., :dk].to(k.dtype), dkv[..., dk:].to(v.dtype),
                None, None, None, None, None, None)


# -- the entry point ------------------------------------------------------------------------

def _gathered_layout(group: Any, mine: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every ring member's chunk ids (an all-gather of a small int tensor, cached per group and layout)."""
    key = (tuple(dist.get_process_group_ranks(group)), mine)
    cached = _LAYOUTS.get(key)
    if cached is None:
        world = dist.get_world_size(group)
        # hccl needs device tensors, gloo host ones: the target's device is right
        local = torch.tensor(mine, dtype=torch.int64, device=current_target().device())
        bufs = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(bufs, local, group=group)
        cached = tuple(tuple(int(x) for x in b.tolist()) for b in bufs)
        _LAYOUTS[key] = cached
    return cached


_LAYOUTS: dict[tuple[Any, ...], tuple[tuple[int, ...], ...]] = {}


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, *, comm_type: str, group: Any, causal: bool,
                               scale: float, dropout: float = 0.0,
                               global_ranks: Sequence[int] | None = None) -> Tensor:
    """Attention over the whole sequence from this rank's load-balanced share; returns this rank's share.

    Megatron (``get_batch_on_this_cp_rank``) cuts the sequence into 2 x CP chunks and gives rank r
    chunks r and 2CP-1-r, which balances causal work. q is (b, s_local, h, d) and k, v are
    (b, s_local, g, d) in that layout, as is the output; differentiable. Causal masking is per chunk:
    a query chunk sees every earlier chunk fully and its own chunk causally. ``comm_type`` is
    Transformer Engine's name, as megatron-core's ``--cp-comm-type`` passes it: ``p2p`` (:class:`_Ring`),
    ``all_gather``, ``a2a`` (Ulysses) or ``a2a+p2p`` (``a2a`` inside the first group of
    ``--hierarchical-context-parallel-sizes``, then ``p2p`` over the second). Block attention runs on
    ``npu_fusion_attention`` (and ``npu_fusion_attention_grad`` in the ring's backward) where the
    current target has them, else in torch.

    ``group`` is the CP process group, or for ``a2a+p2p`` the pair [a2a group, p2p group] of
    megatron's hierarchical CP groups, with ``global_ranks`` the global ranks of the whole CP
    group in CP-rank order.
    """
    kernels = current_target().kernels  # read once: the ring's backward runs on the kernels of its forward
    comm_type = comm_type or "p2p"
    if comm_type not in COMM_TYPES:
        raise ValueError(f"cp_comm_type={comm_type!r} is not one of {', '.join(COMM_TYPES)}")
    if comm_type == "all_gather":
        return _all_gather_attention(q, k, v, group, causal, scale, dropout, kernels)
    if comm_type == "p2p":
        world = dist.get_world_size(group)
        layout = tuple(load_balanced_chunks(r, world) for r in range(world))
        return _Ring.apply(q, k, v, group, layout, causal, scale, dropout, kernels)
    if comm_type == "a2a":
        world = dist.get_world_size(group)
        _check_heads(comm_type, q, k, world)
        chunks = [c for r in range(world) for c in load_balanced_chunks(r, world)]
        return _a2a_attention(q, k, v, group, chunks, causal, scale, dropout, kernels)
    # a2a+p2p
    if not isinstance(group, (list, tuple)) or len(group) != 2:
        raise ValueError("cp_comm_type='a2a+p2p' needs the two hierarchical CP groups [a2a, p2p] "
                         "(--hierarchical-context-parallel-sizes A P with A x P = --context-parallel-size)")
    if global_ranks is None:
        raise ValueError("cp_comm_type='a2a+p2p' needs the global ranks of the whole CP group (cp_global_ranks)")
    inner, outer = group
    world = len(global_ranks)
    cp_rank = {g: i for i, g in enumerate(global_ranks)}
    _check_heads(comm_type, q, k, dist.get_world_size(inner))
    inner_chunks = tuple(c for g in dist.get_process_group_ranks(inner)
                         for c in load_balanced_chunks(cp_rank[g], world))
    q, k, v = (_AllToAll.apply(t, inner, 2, 1) for t in (q, k, v))
    layout = _gathered_layout(outer, inner_chunks)
    out = _Ring.apply(q, k, v, outer, layout, causal, scale, dropout, kernels)
    return _AllToAll.apply(out, inner, 1, 2)
