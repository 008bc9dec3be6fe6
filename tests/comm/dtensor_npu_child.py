"""Child process: SDPA on sharded DTensors on the npu target, through the torch_npu TEST DOUBLE.

Which kernel F.scaled_dot_product_attention reaches on npu depends on torch_npu's backend choice
for PrivateUse1. The double has none, so SDPA takes the math decomposition; a backend with its own
kernel gets aten._scaled_dot_product_fused_attention_overrideable, called here directly with a
REFERENCE kernel registered for the double's host memory (plain attention, clearly not an NPU kernel).
Prints one JSON line of results.
"""

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTORS = os.path.join(os.path.dirname(HERE), "adaptors")
sys.path[:0] = [ADAPTORS, os.path.join(ADAPTORS, "fake_torch_npu")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_npu  # noqa: E402,F401  (the double)

import ascend_patch  # noqa: E402
from ascend_patch.config import Settings  # noqa: E402


def _scores(q, k, attn_bias, is_causal, scale):
    """Plain attention scores: scaled q k^T, the causal mask, the bias."""
    scores = q @ k.transpose(-2, -1) * scale
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return scores + attn_bias if attn_bias is not None else scores


def reference_overrideable(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                           *, scale=None):
    """REFERENCE kernel (test double): what the fused op returns, computed plainly on the host."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = _scores(q, k, attn_bias, is_causal, scale)
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    # the outputs torch's meta kernel for the op describes
    return scores.softmax(-1) @ v, scores.logsumexp(-1), None, None, q.shape[2], k.shape[2], seed, offset, None


def reference_overrideable_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                                    cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                                    scale=None):
    """REFERENCE kernel (test double): the gradients of plain attention (dropout 0), written out."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = _scores(q, k, attn_bias, is_causal, scale)
    p = scores.softmax(-1)
    dp = grad_out @ v.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ grad_out, None


def main():
    report = ascend_patch.apply(Settings(device="npu"))
    lib = torch.library.Library("aten", "IMPL")  # the double's tensors run their ops on host memory
    lib.impl("_scaled_dot_product_fused_attention_overrideable", reference_overrideable, "CPU")
    lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", reference_overrideable_backward, "CPU")
    dist.init_process_group("cpu:gloo,npu:gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cuda", (1,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    dq, dk, dv = (distribute_tensor(t.cuda(), mesh, [Shard(1)]) for t in (q, k, v))
    out = {"target": report.target, "mesh": mesh.device_type, "local_device": str(dq.to_local().device)}
    math_path = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out["math"] = [str(math_path.placements[0]), (math_path.full_tensor().cpu() - expected).abs().max().item()]
    q.requires_grad_()
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected.sum().backward()
    dq.requires_grad_()
    fused = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(dq, dk, dv, None, 0.0, True, False)
    fused[0].sum().backward()  # its backward op, on the sharded heads
    out["overrideable"] = [str(fused[0].placements[0]), (fused[0].full_tensor().cpu() - expected).abs().max().item(),
                           str(fused[1].placements[0]), str(dq.grad.placements[0]),
                           (dq.grad.full_tensor().cpu() - q.grad).abs().max().item()]
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
