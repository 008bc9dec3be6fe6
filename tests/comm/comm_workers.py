"""Worker functions for the multi-process comm tests (run by torch.multiprocessing.spawn).

Each rank builds every rank's inputs from seeds, so it can compute the single-process
reference for the whole group itself and compare its collective's result with it.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from helpers import free_port

# unit roundoff of each dtype: a sum of n terms in the dtype is within (n-1)*u*sum|x| (+u*|sum|)
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11,
                 torch.float64: 2.0 ** -53}



def start(rank: int, world: int, port: int, patched: bool = True, backend: str = "nccl") -> None:
    """Join the process group (``nccl``, which the patch maps to gloo), patched for the cpu target."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    if patched:
        import ascend_patch
        from ascend_patch.config import Settings

        ascend_patch.apply(Settings(device="cpu"))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()


def data(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s input for test ``seed`` (every rank can make every rank's)."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)


def assert_sum(out: torch.Tensor, parts: list[torch.Tensor], average: bool = False) -> None:
    """``out`` is the sum (or mean) of ``parts`` within the rounding bound of its dtype."""
    u = UNIT_ROUNDOFF[out.dtype]
    wide = [p.double() for p in parts]
    ref = sum(wide)
    bound = (len(parts) - 1) * u * sum(w.abs() for w in wide) + u * ref.abs()
    if average:
        ref, bound = ref / len(parts), bound / len(parts) + u * (ref / len(parts)).abs()
    err = (out.double() - ref).abs()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert bool((err <= bound + 1e-300).all()), f"max error {err.max().item()} over bound {bound.max().item()}"


def same_everywhere(tensor: torch.Tensor, group=None) -> None:
    """The tensor is bitwise identical on every rank of ``group``."""
    flat = tensor.reshape(-1).view(torch.uint8) if tensor.dtype.itemsize == 1 else tensor.reshape(-1)
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, flat.contiguous(), group=group)
    for other in everyone:
        assert torch.equal(other, everyone[0]), "ranks disagree"


# suite name -> the module whose CHECKS (functions of rank and world) it runs
SUITES = {"collectives": "comm_collective_checks", "dtypes": "comm_dtype_checks"}


def run_suites(rank: int, world: int, port: int, names: list[str], results_dir: str) -> None:
    """The named suites one after another in one patched process group (one spawn pays the imports once).

    A suite is SUITES' module's CHECKS or ``mesh_and_fsdp``; rank 0 marks each suite that passed on every
    rank with an empty file ``results_dir/NAME``. A failing check raises, which ends the spawn there.
    """
    import importlib

    start(rank, world, port)
    try:
        for name in names:
            checks = [mesh_and_fsdp] if name == "mesh_and_fsdp" else importlib.import_module(SUITES[name]).CHECKS
            for check in checks:
                check(rank, world)
                dist.barrier()
            if rank == 0:
                open(os.path.join(results_dir, name), "w").close()
    finally:
        finish()


def gaps_unpatched(rank: int, world: int, port: int) -> None:
    """Plain gloo lacks what the fallbacks provide: each form raises without ascend_patch."""
    start(rank, world, port, patched=False, backend="gloo")
    try:
        from comm_collective_checks import GAPS

        failures = []
        for name, attempt in GAPS:
            group = dist.new_group(backend="gloo")  # a failure cannot leak into the next attempt's waits
            try:
                attempt(rank, world, group)
                dist.barrier(group=group)  # where gloo reports a failure it did not raise at the call
                failures.append(name)
            except (RuntimeError, ValueError):
                pass
            dist.barrier()
        assert not failures, f"plain gloo handled {failures}: the fallback may no longer be needed"
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., None], world: int, *extra: object) -> None:
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(world, free_port(), *extra), nprocs=world, join=True)


def mesh_and_fsdp(rank: int, world: int) -> None:
    """init_device_mesh('cuda') -> a mesh of the target; DTensor and FSDP2 over it match one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
    assert mesh.device_type == "cpu"
    assert dist.get_backend(mesh.get_group("dp")) == "nccl"  # program code asked for nccl
    full = data(0, (4 * world, 3), torch.float32, 200)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full.chunk(world)[rank])
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2, device="cuda")
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    fully_shard(model, mesh=mesh)
    inputs = [data(r, (5, 3), torch.float32, 201) for r in range(world)]
    model(inputs[rank]).pow(2).sum().backward()
    # one process: FSDP averages the ranks' gradients
    grads = []
    for x in inputs:
        reference.zero_grad()
        reference(x).pow(2).sum().backward()
        grads.append(reference.weight.grad.clone())
    torch.testing.assert_close(model.weight.grad.full_tensor(), sum(grads) / world, rtol=1e-5, atol=1e-6)
