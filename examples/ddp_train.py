"""Data-parallel training written for CUDA GPUs and NCCL, the way the PyTorch DDP tutorial does it.

    torchrun --nproc-per-node 2 examples/ddp_train.py                     # on a CUDA machine
    torchrun --nproc-per-node 2 -m ascend_patch examples/ddp_train.py     # anywhere, via ascend_patch

Each rank trains on its own shard of a synthetic regression problem. With
--dump-grads, rank 0 writes the first step's averaged gradients (and every rank's
batch) so a test can check them against a single-process computation.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batch_for(rank, step, size=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dump-grads", default=None)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(local_rank)

    model = make_model().cuda(local_rank)
    ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    losses = []
    for step in range(args.steps):
        x, y = batch_for(rank, step)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if step == 0 and args.dump_grads and rank == 0:
            torch.save({"world": world, "grads": [p.grad.detach().cpu() for p in model.parameters()]},
                       args.dump_grads)
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        losses.append(reduced.item() / world)
    if rank == 0:
        print(f"backend {dist.get_backend()} world {world}")
        print("losses: " + " ".join(f"{x:.5f}" for x in losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
