"""Per-call cost of the cpu target's collective wrappers, measured side by side in one run.

One process, a world of 2 over gloo (two spawned ranks), small tensors so the wrapper's
share is as large as it gets. Prints the patched / unpatched time ratio per collective.

    PYTHONPATH=. python benchmarks/comm_wrapper_overhead.py
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CALLS = 2000


def _time(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    dist.barrier()
    return (time.perf_counter() - start) / CALLS


def _cases(world: int):
    x = torch.ones(64, dtype=torch.bfloat16)
    out = torch.empty(64 * world, dtype=torch.bfloat16)
    big = torch.ones(64 * world, dtype=torch.bfloat16)
    small = torch.empty(64, dtype=torch.bfloat16)
    return {
        "all_reduce bf16": lambda: dist.all_reduce(x),
        "all_gather_into_tensor bf16": lambda: dist.all_gather_into_tensor(out, x),
        "reduce_scatter_tensor bf16": lambda: dist.reduce_scatter_tensor(small, big),
        "broadcast bf16": lambda: dist.broadcast(x, 0),
    }


def worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    import ascend_patch
    from ascend_patch.config import Settings

    results = {}
    for round_ in range(3):  # alternate to spread drift over both sides
        for patched in (False, True):
            if patched:
                ascend_patch.apply(Settings(device="cpu"))
            for name, fn in _cases(world).items():
                results.setdefault((name, patched), []).append(_time(fn))
            if patched:
                ascend_patch.remove()
    if rank == 0:
        print(f"{'collective':32s} {'unpatched us':>13s} {'patched us':>11s} {'ratio':>7s}")
        for name in _cases(world):
            plain, ours = min(results[(name, False)]), min(results[(name, True)])
            print(f"{name:32s} {plain * 1e6:13.1f} {ours * 1e6:11.1f} {ours / plain:7.3f}")
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("ASCEND_PATCH", "0")
    mp.spawn(worker, args=(2, port), nprocs=2)


if __name__ == "__main__":
    sys.exit(main())
