"""One rank of the DTensor attention test: a Llama-style block (pytorch/examples' fsdp_tp_example shape:
dim 256, 16 heads, SDPA with is_causal) tensor-parallel over the ranks with that example's plan, against
the same block unsharded. Run as ``python -m ascend_patch dtensor_attention_child.py OUT`` per rank."""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

DIM, HEADS, SEQ, BATCH = 256, 16, 32, 4


class Attention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.dropout = dropout

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))


class Block(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention = Attention(dropout)
        self.w1, self.w3 = nn.Linear(DIM, 4 * DIM, bias=False), nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


PLAN = {  # pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py, per block
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "attention.wq": ColwiseParallel(use_local_output=False),
    "attention.wk": ColwiseParallel(use_local_output=False),
    "attention.wv": ColwiseParallel(use_local_output=False),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "w1": ColwiseParallel(), "w3": ColwiseParallel(),
    "w2": RowwiseParallel(output_layouts=Shard(1)),
}


def main(out_path):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = Block()
    sharded = Block()
    sharded.load_state_dict(reference.state_dict())
    sharded = parallelize_module(sharded.cuda(), mesh, PLAN)
    x = torch.randn(BATCH, SEQ, DIM)
    # the reference: the whole batch and sequence on one rank
    expected = reference(x)
    expected.square().mean().backward()
    # sharded: the sequence split over the ranks (SequenceParallel norms), heads over the ranks in attention
    from torch.distributed.tensor import DTensor

    local = x.cuda().chunk(world, dim=1)[rank]  # between modules the plan passes local sequence shards
    full = DTensor.from_local(sharded(local), mesh, [Shard(1)], run_check=False).full_tensor()
    full.square().mean().backward()
    grads = {}
    for name, param in sharded.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        grads[name] = (grad - dict(reference.named_parameters())[name].grad).abs().max().item()
    # dropout > 0 takes SDPA's math path on the host; it must run on the sharded heads too
    dropped = parallelize_module(Block(dropout=0.5).cuda(), mesh, PLAN)
    shape = list(DTensor.from_local(dropped(local), mesh, [Shard(1)], run_check=False).full_tensor().shape)
    result = {"rank": rank, "world": world, "out_err": (full - expected).abs().max().item(),
              "out_scale": expected.abs().max().item(), "grad_err": max(grads.values()), "grads": len(grads),
              "dropout_shape": shape}
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
