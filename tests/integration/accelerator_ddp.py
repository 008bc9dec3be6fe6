"""A DDP script in today's torch.accelerator style (pytorch/examples' ddp idiom), for test_accelerator_ddp.py.

Nothing here is ascend_patch's: it asks torch.accelerator for the device, the count and
the collective backend, selects its device by local rank, trains a few steps under DDP
and writes rank 0's losses and final parameters.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def main():
    if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2):
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        sys.exit(3)
    acc = torch.accelerator.current_accelerator()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(local_rank)
    dist.init_process_group(backend=dist.get_default_backend_for_device(acc))
    rank = dist.get_rank()
    device = torch.device(acc.type, torch.accelerator.current_device_index())
    model = DDP(make_model().to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        x, y = (t.to(device) for t in batch(step, rank))
        with torch.autocast(device_type=acc.type, dtype=torch.bfloat16, enabled=False):
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.accelerator.synchronize()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        losses.append(summed.item() / dist.get_world_size())
    if rank == 0:
        torch.save({"losses": losses, "params": [p.detach().cpu() for p in model.module.parameters()],
                    "backend": dist.get_backend(), "device": str(device), "acc": str(acc)}, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
