"""Collectives in every dtype and reduce op docs/parallelism.md §4 names, against one-process references.

Run by ``comm_workers.run_suites`` at world sizes 2 and 4 (gloo, patched cpu
target): fp64, int8/32/64, uint8, bool, complex64 — and bf16/fp16/fp32 for the ops the
fp tests elsewhere do not cover — through ``all_reduce`` and ``reduce`` with
SUM/MIN/MAX/PRODUCT (and AVG for floating dtypes), sync and async, inside
``_coalescing_manager``, uneven ``reduce_scatter`` lists, and the data movers
(broadcast, all_gather_into_tensor, all_to_all_single, batch_isend_irecv).

Reference semantics are NCCL's: integers wrap (uint8 200 + 100 = 44), bool SUM is a
logical or and PRODUCT a logical and, complex tensors take SUM/AVG only (torch refuses
the others before any backend sees them).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from comm_workers import UNIT_ROUNDOFF, assert_sum, same_everywhere

Op = dist.ReduceOp
INTS = (torch.int8, torch.int32, torch.int64, torch.uint8)
EXACT = (*INTS, torch.bool)


def values(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int, small: bool = False) -> torch.Tensor:
    """Rank ``rank``'s input for check ``seed``: uint8 over its whole range (sums wrap), signed ints
    small enough not to overflow (``small``: products of four stay in int8), random bools."""
    g = torch.Generator().manual_seed(seed * 1013 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.int64).to(torch.uint8)
    if dtype in INTS:
        bound = 3 if small or dtype == torch.int8 else 1000
        return torch.randint(-bound, bound + 1, shape, generator=g, dtype=torch.int64).to(dtype)
    wide = torch.randn(shape, generator=g, dtype=torch.float64) * (1.5 if small else 3)
    if dtype.is_complex:
        imag = torch.randn(shape, generator=g, dtype=torch.float64) * 3
        return torch.complex(wide, imag).to(dtype)
    return wide.to(dtype)


def _everyone(world: int, shape, dtype, seed: int, small: bool = False) -> list[torch.Tensor]:
    return [values(r, shape, dtype, seed, small) for r in range(world)]


def reference(parts: list[torch.Tensor], op) -> torch.Tensor:
    """The reduction computed in one process, in the dtype (integers wrap as the collective's do)."""
    if parts[0].dtype == torch.bool:
        stacked = torch.stack(parts)
        return stacked.any(0) if op in (Op.SUM, Op.MAX) else stacked.all(0)
    if op == Op.MIN:
        return torch.stack(parts).min(0).values
    if op == Op.MAX:
        return torch.stack(parts).max(0).values
    combine = torch.add if op in (Op.SUM, Op.AVG) else torch.mul
    out = functools.reduce(combine, parts[1:], parts[0].clone())
    return out / len(parts) if op == Op.AVG else out


def assert_reduced(out: torch.Tensor, parts: list[torch.Tensor], op) -> None:
    """``out`` is the reduction of ``parts``: exact for integers, bools, MIN and MAX; within the
    dtype's rounding bound for floating SUM/AVG/PRODUCT."""
    assert out.dtype == parts[0].dtype and out.shape == parts[0].shape
    if out.dtype in EXACT or op in (Op.MIN, Op.MAX):
        assert torch.equal(out, reference(parts, op)), (op, out, reference(parts, op))
    elif out.dtype.is_complex:
        wide = [p.to(torch.complex128) for p in parts]
        torch.testing.assert_close(out.to(torch.complex128), reference(wide, op), rtol=1e-5, atol=1e-5)
    elif op in (Op.SUM, Op.AVG):
        assert_sum(out, parts, average=op == Op.AVG)
    else:  # PRODUCT: each of the n-1 multiplications rounds once
        ref = reference([p.double() for p in parts], op)
        bound = (len(parts) - 1) * UNIT_ROUNDOFF[out.dtype] * 1.01 * ref.abs() + torch.finfo(out.dtype).tiny
        assert bool(((out.double() - ref).abs() <= bound).all()), (out, ref)


def _ops(dtype: torch.dtype) -> list:
    if dtype.is_complex:
        return [Op.SUM, Op.AVG]
    ops = [Op.SUM, Op.MIN, Op.MAX, Op.PRODUCT]
    return ops + [Op.AVG] if dtype.is_floating_point else ops


DTYPES = (torch.float64, torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64)


def check_all_reduce_every_dtype_and_op(rank: int, world: int) -> None:
    for i, dtype in enumerate((*DTYPES, torch.float32, torch.bfloat16, torch.float16)):
        for j, op in enumerate(_ops(dtype)):
            parts = _everyone(world, (37,), dtype, 300 + 10 * i + j, small=op == Op.PRODUCT)
            x = parts[rank].clone()
            if j % 2:
                dist.all_reduce(x, op=op, async_op=True).wait()
            else:
                dist.all_reduce(x, op=op)
            assert_reduced(x, parts, op)
            same_everywhere(x)


def check_reduce_every_dtype_and_op(rank: int, world: int) -> None:
    dst = world - 1
    for i, dtype in enumerate((*DTYPES, torch.float32, torch.bfloat16, torch.float16)):
        for j, op in enumerate(_ops(dtype)):
            parts = _everyone(world, (2, 9), dtype, 400 + 10 * i + j, small=op == Op.PRODUCT)
            x = parts[rank].clone()
            work = dist.reduce(x, dst=dst, op=op, async_op=bool(j % 2))
            if work is not None:
                work.wait()
            if rank == dst:
                assert_reduced(x, parts, op)


def check_uneven_reduce_scatter_lists(rank: int, world: int) -> None:
    # rank r receives the reduction of every rank's r-th chunk, which has r + 2 rows
    for i, (dtype, op) in enumerate(((torch.float32, Op.SUM), (torch.bfloat16, Op.SUM), (torch.float64, Op.MAX),
                                     (torch.int64, Op.SUM), (torch.uint8, Op.SUM), (torch.int32, Op.MIN),
                                     (torch.bool, Op.SUM), (torch.float16, Op.AVG))):
        lists = [[values(src, (r + 2, 3), dtype, 500 + 10 * i + r) for r in range(world)] for src in range(world)]
        out = torch.empty(rank + 2, 3, dtype=dtype)
        work = dist.reduce_scatter(out, [t.clone() for t in lists[rank]], op=op, async_op=bool(i % 2))
        if work is not None:
            work.wait()
        assert_reduced(out, [lists[src][rank] for src in range(world)], op)


def check_movement_every_dtype(rank: int, world: int) -> None:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for i, dtype in enumerate(DTYPES):
        parts = _everyone(world, (world * 2, 3), dtype, 600 + i)
        x = parts[rank].clone()
        dist.broadcast(x, src=world - 1, async_op=True).wait()
        assert torch.equal(x, parts[world - 1])
        gathered = torch.empty(world * world * 2, 3, dtype=dtype)
        dist.all_gather_into_tensor(gathered, parts[rank])
        assert torch.equal(gathered, torch.cat(parts))
        exchanged = torch.empty(world * 2, 3, dtype=dtype)
        dist.all_to_all_single(exchanged, parts[rank])
        assert torch.equal(exchanged, torch.cat([p[rank * 2:(rank + 1) * 2] for p in parts]))
        got = torch.empty(world * 2, 3, dtype=dtype)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, parts[rank], nxt),
                                            dist.P2POp(dist.irecv, got, prev)]):
            work.wait()
        assert torch.equal(got, parts[prev])


def check_coalesced_integer_and_bool_reductions(rank: int, world: int) -> None:
    lows = _everyone(world, (5,), torch.int32, 700)
    highs = _everyone(world, (4,), torch.int32, 701)
    flags = _everyone(world, (6,), torch.bool, 702)
    a, b = lows[rank].clone(), highs[rank].clone()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a, op=Op.MIN)
        dist.all_reduce(b, op=Op.MIN)
    cm.wait()
    assert_reduced(a, lows, Op.MIN)
    assert_reduced(b, highs, Op.MIN)
    c = flags[rank].clone()
    with dist._coalescing_manager():
        dist.all_reduce(c, op=Op.PRODUCT)
    assert_reduced(c, flags, Op.PRODUCT)


def check_integer_wraparound_as_nccl(rank: int, world: int) -> None:
    x = torch.tensor([200, 3 + rank], dtype=torch.uint8)
    dist.all_reduce(x)
    assert x.tolist() == [(200 * world) % 256, (3 * world + sum(range(world))) % 256]
    y = torch.tensor([rank + 1, -(rank + 1)], dtype=torch.int64)
    dist.all_reduce(y, op=Op.PRODUCT)
    assert y.tolist() == [math.factorial(world), (-1) ** world * math.factorial(world)]


CHECKS = [check_all_reduce_every_dtype_and_op, check_reduce_every_dtype_and_op, check_uneven_reduce_scatter_lists,
          check_movement_every_dtype, check_coalesced_integer_and_bool_reductions, check_integer_wraparound_as_nccl]
