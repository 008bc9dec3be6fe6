"""One rank of the gloo teardown test (run as ``python -m ascend_patch teardown_child.py MODE``).

Rank 0 launches an all-reduce from thread-local state holding a Python object, as every
collective launched during ``backward()`` does (DDP's gradient all-reduce), and lets go of
its handle, so gloo's worker thread holds the last reference; it then keeps the GIL (a long
switch interval, a pure-Python loop) until the result has landed, so the worker's release
of that object waits for the GIL. MODE ``exit`` then just ends the script;
``destroy`` calls ``destroy_process_group()`` first and drops a DDP model whose reducer
holds the group. Unmitigated, the worker takes the GIL while the interpreter finalizes:
``terminate called without an active exception``.
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

mode = sys.argv[1]
dist.init_process_group("nccl")
ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2)) if mode == "destroy" else None
if dist.get_rank() == 1:
    time.sleep(0.5)  # rank 0 has let go of its handle by now: only its worker thread holds the work
    dist.all_reduce(torch.ones(4))
    if mode == "destroy":
        dist.destroy_process_group()
    sys.exit(0)
result = torch.ones(4)
landed = result.numpy()
torch._C._stash_obj_in_tls("context", object())  # what torch.autograd.backward does
work = dist.all_reduce(result, async_op=True)  # captures the thread-local state
torch._C._remove_obj_from_tls("context")  # backward's finally
del work
sys.setswitchinterval(60.0)
while not (landed == 2.0).all():  # holds the GIL (numpy reads do not release it)
    pass
if mode == "destroy":
    dist.destroy_process_group()
    del ddp
print(f"rank 0 done: {landed.tolist()}")  # flushed at exit, which releases the GIL
