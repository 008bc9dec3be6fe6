"""The collective checks each rank runs (see comm_workers.run_suites), and the gloo gaps (GAPS).

References are single-process computations over every rank's input (each rank can
build them all, see ``data``). Reduced-precision sums are checked against the float64
sum within the dtype's rounding bound, and for equality across ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from comm_workers import assert_sum, data, same_everywhere

F8 = torch.float8_e4m3fn


def _everyone(world: int, shape, dtype, seed: int) -> list[torch.Tensor]:
    return [data(r, shape, dtype, seed) for r in range(world)]


def check_all_reduce(rank: int, world: int) -> None:
    for seed, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16), start=1):
        parts = _everyone(world, (257,), dtype, seed)
        x = parts[rank].clone()
        dist.all_reduce(x)
        assert_sum(x, parts)
        same_everywhere(x)
        y = parts[rank].clone()
        work = dist.all_reduce(y, op=dist.ReduceOp.AVG, async_op=True)
        work.wait()
        assert_sum(y, parts, average=True)
    parts = _everyone(world, (33,), torch.float32, 7)
    m = parts[rank].clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.equal(m, torch.stack(parts).max(0).values)


def check_all_gather_into_tensor(rank: int, world: int) -> None:
    for seed, dtype in ((11, torch.float32), (12, torch.bfloat16)):
        parts = _everyone(world, (3, 5), dtype, seed)
        out = torch.empty(3 * world, 5, dtype=dtype)
        dist.all_gather_into_tensor(out, parts[rank])
        assert torch.equal(out, torch.cat(parts))
        stacked = torch.empty(world, 3, 5, dtype=dtype)  # NCCL's second output form (a gloo gap)
        work = dist.all_gather_into_tensor(stacked, parts[rank], async_op=True)
        work.wait()
        assert torch.equal(stacked, torch.stack(parts))
    scalars = _everyone(world, (), torch.float32, 13)
    out = torch.empty(world)
    dist.all_gather_into_tensor(out, scalars[rank])
    assert torch.equal(out, torch.stack(scalars))
    # a non-contiguous stacked output: gathered into scratch, copied back when the handle is waited on
    parts = _everyone(world, (4,), torch.bfloat16, 14)
    backing = torch.zeros(4, world, dtype=torch.bfloat16)
    target = backing.t()
    work = dist.all_gather_into_tensor(target, parts[rank], async_op=True)
    work.wait()
    assert torch.equal(backing.t(), torch.stack(parts))
    assert work.is_completed()


def check_reduce_scatter_tensor(rank: int, world: int) -> None:
    for seed, dtype in ((21, torch.float32), (22, torch.bfloat16)):
        parts = _everyone(world, (world * 6,), dtype, seed)
        out = torch.empty(6, dtype=dtype)
        dist.reduce_scatter_tensor(out, parts[rank].clone())
        assert_sum(out, [p[rank * 6:(rank + 1) * 6] for p in parts])
        avg = torch.empty(6, dtype=dtype)
        work = dist.reduce_scatter_tensor(avg, parts[rank].clone(), op=dist.ReduceOp.AVG, async_op=True)
        work.wait()
        assert_sum(avg, [p[rank * 6:(rank + 1) * 6] for p in parts], average=True)
    parts = _everyone(world, (world, 2, 3), torch.bfloat16, 23)  # stacked input (a gloo gap)
    out = torch.empty(2, 3, dtype=torch.bfloat16)
    work = dist.reduce_scatter_tensor(out, parts[rank], async_op=True)
    work.wait()
    assert_sum(out, [p[rank] for p in parts])


def check_all_to_all_single(rank: int, world: int) -> None:
    parts = _everyone(world, (world * 2, 3), torch.float32, 31)
    out = torch.empty(world * 2, 3)
    dist.all_to_all_single(out, parts[rank])
    assert torch.equal(out, torch.cat([p[rank * 2:(rank + 1) * 2] for p in parts]))
    # MoE-style uneven splits: rank r sends r + j + 1 rows to rank j
    sends = [[r + j + 1 for j in range(world)] for r in range(world)]
    rows = [data(r, (sum(sends[r]), 4), torch.bfloat16, 32) for r in range(world)]
    received = [sends[j][rank] for j in range(world)]
    out = torch.empty(sum(received), 4, dtype=torch.bfloat16)
    work = dist.all_to_all_single(out, rows[rank], received, sends[rank], async_op=True)
    work.wait()
    pieces = [rows[j].split(sends[j])[rank] for j in range(world)]
    assert torch.equal(out, torch.cat(pieces))


def check_broadcast(rank: int, world: int) -> None:
    for seed, dtype in ((41, torch.float32), (42, torch.bfloat16)):
        parts = _everyone(world, (9,), dtype, seed)
        x = parts[rank].clone()
        work = dist.broadcast(x, src=world - 1, async_op=True)
        work.wait()
        assert torch.equal(x, parts[world - 1])


def check_batch_isend_irecv(rank: int, world: int) -> None:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    acts = _everyone(world, (2, 3), torch.bfloat16, 51)
    grads = _everyone(world, (5,), torch.float32, 52)
    got_act, got_grad = torch.empty(2, 3, dtype=torch.bfloat16), torch.empty(5)
    ops = [dist.P2POp(dist.isend, acts[rank], nxt), dist.P2POp(dist.irecv, got_act, prev),
           dist.P2POp(dist.isend, grads[rank], prev), dist.P2POp(dist.irecv, got_grad, nxt)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got_act, acts[prev])
    assert torch.equal(got_grad, grads[nxt])


def check_coalescing(rank: int, world: int) -> None:
    # Megatron's DDP: reduce-scatter every bucket of a bucket group in one coalesced, async call
    buckets = [_everyone(world, (world * n,), torch.bfloat16, 60 + n) for n in (4, 8)]
    outs = [torch.empty(n, dtype=torch.bfloat16) for n in (4, 8)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, parts in zip(outs, buckets):
            dist.reduce_scatter_tensor(out, parts[rank].clone(), op=dist.ReduceOp.AVG)
    cm.wait()
    for out, parts, n in zip(outs, buckets, (4, 8)):
        assert_sum(out, [p[rank * n:(rank + 1) * n] for p in parts], average=True)
    # the distributed optimizer's parameter all-gather
    shards = [_everyone(world, (n,), torch.bfloat16, 65 + n) for n in (3, 5)]
    gathered = [torch.empty(world * n, dtype=torch.bfloat16) for n in (3, 5)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, parts in zip(gathered, shards):
            dist.all_gather_into_tensor(out, parts[rank])
    cm.wait()
    for out, parts in zip(gathered, shards):
        assert torch.equal(out, torch.cat(parts))
    # grads of mixed dtypes all-reduced together (a gloo gap), async and sync
    for async_ops in (True, False):
        fp32 = _everyone(world, (7,), torch.float32, 70)
        bf16 = _everyone(world, (6,), torch.bfloat16, 71)
        a, b = fp32[rank].clone(), bf16[rank].clone()
        with dist._coalescing_manager(async_ops=async_ops) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        if async_ops:
            cm.wait()
        assert_sum(a, fp32)
        assert_sum(b, bf16)


def check_uneven_all_gather(rank: int, world: int) -> None:
    parts = [data(r, (r + 1, 2), torch.bfloat16, 80) for r in range(world)]
    outs = [torch.empty(r + 1, 2, dtype=torch.bfloat16) for r in range(world)]
    dist.all_gather(outs, parts[rank])
    assert all(torch.equal(o, p) for o, p in zip(outs, parts))
    outs = [torch.empty(r + 1, 2, dtype=torch.bfloat16) for r in range(world)]
    work = dist.all_gather(outs, parts[rank], async_op=True)
    fut = work.get_future()
    fut.wait()
    assert all(torch.equal(o, p) for o, p in zip(outs, parts))


def check_premul_sum(rank: int, world: int) -> None:
    parts = _everyone(world, (10,), torch.float32, 90)
    x = parts[rank].clone()
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
    torch.testing.assert_close(x, sum(p * 0.25 for p in parts), rtol=1e-6, atol=1e-6)
    parts = _everyone(world, (world * 3,), torch.float32, 91)
    source = parts[rank].clone()
    out = torch.empty(3)
    work = dist.reduce_scatter_tensor(out, source, op=dist._make_nccl_premul_sum(1.0 / world), async_op=True)
    work.wait()
    torch.testing.assert_close(out, sum(p[rank * 3:(rank + 1) * 3] for p in parts) / world, rtol=1e-6, atol=1e-6)
    assert torch.equal(source, parts[rank]), "the input of a reduce-scatter must stay as it was"


def check_float8(rank: int, world: int) -> None:
    parts = [data(r, (8,), torch.float32, 100).to(F8) for r in range(world)]
    x = parts[rank].clone()
    dist.broadcast(x, src=0)
    assert torch.equal(x.view(torch.uint8), parts[0].view(torch.uint8))
    out = torch.empty(world * 8, dtype=F8)
    dist.all_gather_into_tensor(out, parts[rank])
    assert torch.equal(out.view(torch.uint8), torch.cat(parts).view(torch.uint8))
    y = parts[rank].clone()
    work = dist.all_reduce(y, async_op=True)
    work.wait()
    # the fp32 sum of a few float8 values is exact; the result is that sum rounded to float8 once
    expected = sum(p.float() for p in parts).to(F8)
    assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8))


def check_subgroups(rank: int, world: int) -> None:
    if world < 4:
        return
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank makes every group, in order
    mine, members = groups[rank % 2], [[0, 2], [1, 3]][rank % 2]
    parts = {r: data(r, (65,), torch.bfloat16, 110) for r in members}
    x = parts[rank].clone()
    dist.all_reduce(x, group=mine)
    assert_sum(x, [parts[r] for r in members])
    same_everywhere(x, group=mine)
    shapes = {r: (r + 1,) for r in members}
    pieces = {r: data(r, shapes[r], torch.float32, 111) for r in members}
    outs = [torch.empty(shapes[r]) for r in members]
    work = dist.all_gather(outs, pieces[rank], group=mine, async_op=True)
    work.wait()
    assert all(torch.equal(o, pieces[r]) for o, r in zip(outs, members))
    a = data(rank, (3,), torch.float32, 112)
    b = data(rank, (3,), torch.bfloat16, 113)
    with dist._coalescing_manager(group=mine, async_ops=True) as cm:
        dist.all_reduce(a, group=mine)
        dist.all_reduce(b, group=mine)
    cm.wait()
    assert_sum(a, [data(r, (3,), torch.float32, 112) for r in members])
    assert_sum(b, [data(r, (3,), torch.bfloat16, 113) for r in members])


CHECKS = [check_all_reduce, check_all_gather_into_tensor, check_reduce_scatter_tensor, check_all_to_all_single,
          check_broadcast, check_batch_isend_irecv, check_coalescing, check_uneven_all_gather, check_premul_sum,
          check_float8, check_subgroups]


# Each gap is tried in a process group of its own: gloo reports some of these failures only when
# a later call on the same group waits (a barrier waits for the group's earlier work), which
# would make the default group's barrier fail on one rank and hang on the other.

def _stacked_gather(rank: int, world: int, group) -> None:
    dist.all_gather_into_tensor(torch.empty(world, 2), torch.ones(2), group=group)


def _stacked_scatter(rank: int, world: int, group) -> None:
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(world, 2), group=group)


def _uneven_gather(rank: int, world: int, group) -> None:
    dist.all_gather([torch.empty(r + 1) for r in range(world)], torch.ones(rank + 1), group=group)


def _mixed_coalesced(rank: int, world: int, group) -> None:
    with dist._coalescing_manager(group=group):
        dist.all_reduce(torch.ones(2), group=group)
        dist.all_reduce(torch.ones(2, dtype=torch.bfloat16), group=group)


def _premul(rank: int, world: int, group) -> None:
    dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(0.5), group=group)


def _float8(rank: int, world: int, group) -> None:
    dist.broadcast(torch.ones(2, dtype=F8), src=0, group=group)


GAPS = [("stacked all_gather_into_tensor", _stacked_gather), ("stacked reduce_scatter_tensor", _stacked_scatter),
        ("uneven all_gather", _uneven_gather), ("mixed-dtype coalesced all_reduce", _mixed_coalesced),
        ("PREMUL_SUM", _premul), ("float8 broadcast", _float8)]
