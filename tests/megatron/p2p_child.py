"""Child of test_mcore_p2p.py (torchrun, 2 processes): overlapped pipeline sends, then Megatron's
pseudo-deallocation of the sent output, then memory churn, as the interleaved schedule does.

The same sends run on plain gloo first, then with ascend_patch applied (megatron-core is
imported before, so the patch wraps the imported module); prints one JSON line with the number
of sends the receiver got wrong in each phase."""

import json
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
from megatron.core.pipeline_parallel import p2p_communication  # noqa: E402
from megatron.core.pipeline_parallel.schedules import deallocate_output_tensor  # noqa: E402

SENDS, SHAPE = 40, (64, 2, 512)


def phase() -> int:
    rank, wrong = dist.get_rank(), 0
    for i in range(SENDS):
        if rank == 0:
            out = torch.full(SHAPE, 1.0) * (i + 1)  # a fresh activation, not a view
            reqs = p2p_communication._p2p_ops(tensor_send_prev=None, tensor_recv_prev=None, tensor_send_next=out,
                                              tensor_recv_next=None, group=dist.group.WORLD, prev_pipeline_rank=1,
                                              next_pipeline_rank=1)
            deallocate_output_tensor(out, True)  # what the schedule does right after the send
            churn = [torch.full(SHAPE, -7.0) for _ in range(4)]  # the freed block is reused at once
            for req in reqs.values():
                req.wait()
            del churn
        else:
            # gloo sends only once the receiver has posted its recv: posting it late makes the sender's
            # read of the activation come after the deallocation and churn on every send, not by chance
            time.sleep(0.05)
            buf = torch.empty(SHAPE)
            reqs = p2p_communication._p2p_ops(tensor_send_prev=None, tensor_recv_prev=buf, tensor_send_next=None,
                                              tensor_recv_next=None, group=dist.group.WORLD, prev_pipeline_rank=0,
                                              next_pipeline_rank=0)
            for req in reqs.values():
                req.wait()
            wrong += int(not torch.equal(buf, torch.full(SHAPE, float(i + 1))))
        dist.barrier()
    return wrong


stock = phase()
import ascend_patch  # noqa: E402
from ascend_patch.config import Settings  # noqa: E402

ascend_patch.apply(Settings(device="cpu"))
patched = phase()
ascend_patch.remove()
if dist.get_rank() == 1:
    print("RESULT" + json.dumps({"stock": stock, "patched": patched, "sends": SENDS}), flush=True)
dist.destroy_process_group()
