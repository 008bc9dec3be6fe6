"""An mp.spawn script written for one node with 2 GPUs (used by test_spawn.py; nothing here is ascend_patch's).

The collective is bound by a from-import at the top, which a spawn child runs again (as
``__mp_main__``) before its worker starts; each worker selects its GPU by rank.
"""
from torch.distributed import all_reduce, destroy_process_group, init_process_group
import json
import sys

import torch
import torch.multiprocessing as mp

AT_IMPORT = torch.cuda.device_count()


def worker(rank, world, port, out):
    torch.cuda.set_device(rank)
    init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.ones(1, device="cuda") * (rank + 1)
    all_reduce(t)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "current": torch.cuda.current_device(), "count": torch.cuda.device_count(),
                   "accelerator_count": torch.accelerator.device_count(), "at_import": AT_IMPORT,
                   "sum": t.item(), "device": str(t.device)}, f)
    destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
    print("parent count", torch.cuda.device_count())
