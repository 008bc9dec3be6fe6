"""Context-parallel attention (ascend_patch.ops.context_parallel) and its ring step (ops.attention_block).

The ring's block forward/backward against autograd through textbook attention (cpu path, and the npu
path with reference kernels of npu_fusion_attention / npu_fusion_attention_grad injected); then every
comm type over real gloo processes: 4 processes run CP4 with p2p, all_gather, a2a and a2a+p2p
(hierarchical 2 x 2) and CP2 on two of them, forward and backward, against full attention; p2p and a2a+p2p
also on the npu path (reference kernels in the kernel table, as the hccl target would run them).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from ascend_patch.backend import KernelTable
from ascend_patch.ops.attention_block import block_backward, block_forward, merge
from npu_references import CallLog, reference_npu_fusion_attention, reference_npu_fusion_attention_grad


def explicit(q, k, v, causal, scale, keep=None):
    """Textbook attention: q (b, sq, h, d), k/v (b, sk, g, d); causal bottom-right; returns (out, lse)."""
    h, g = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(h // g, 2), v.repeat_interleave(h // g, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = s.softmax(-1)
    if keep is not None:
        p = p * keep
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def _inputs(seed, sq=6, sk=10, h=4, g=2, d=8):
    torch.manual_seed(seed)
    return torch.randn(2, sq, h, d), torch.randn(2, sk, g, d), torch.randn(2, sk, g, d), torch.randn(2, sq, h, d)


@pytest.mark.parametrize("causal", [True, False])
def test_block_forward_and_backward_are_attention_and_its_gradient(causal):
    q, k, v, dout = _inputs(0)
    res = block_forward(q, k, v, causal=causal, scale=0.3)
    ref_out, ref_lse = explicit(q, k, v, causal, 0.3)
    torch.testing.assert_close(res.out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.lse, ref_lse, rtol=1e-5, atol=1e-6)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    torch.autograd.backward(explicit(*leaves, causal, 0.3)[0], dout)
    got = block_backward(q, k, v, res.out, dout, res.lse, causal=causal, scale=0.3)
    for a, leaf in zip(got, leaves):
        torch.testing.assert_close(a, leaf.grad, rtol=1e-5, atol=1e-5)


def test_two_merged_blocks_backpropagate_as_one_softmax():
    """The ring's premise: blocks merged by log-sum-exp, each backpropagated with the merged statistics."""
    q, k, v, dout = _inputs(1, sq=4, sk=12)
    first = block_forward(q, k[:, :8], v[:, :8], causal=False, scale=0.25)
    second = block_forward(q, k[:, 8:], v[:, 8:], causal=True, scale=0.25)
    out, lse = merge(*merge(None, None, first.out, first.lse), second.out, second.lse)
    ref, _ = explicit(q, k, v, True, 0.25)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    torch.autograd.backward(explicit(*leaves, True, 0.25)[0], dout)
    a = block_backward(q, k[:, :8], v[:, :8], out, dout, lse, causal=False, scale=0.25)
    b = block_backward(q, k[:, 8:], v[:, 8:], out, dout, lse, causal=True, scale=0.25)
    torch.testing.assert_close(a[0] + b[0], leaves[0].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([a[1], b[1]], 1), leaves[1].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([a[2], b[2]], 1), leaves[2].grad, rtol=1e-5, atol=1e-5)


def test_block_dropout_mask_is_regenerated_in_backward():
    from ascend_patch.ops.attention_block import _dropout_mask

    q, k, v, dout = _inputs(2)
    torch.manual_seed(7)
    res = block_forward(q, k, v, causal=True, scale=0.3, dropout=0.25)
    keep = _dropout_mask(torch.Size([2, 4, 6, 10]), 0.25, res.state, q.device)
    assert 0 < int((keep == 0).sum()) < keep.numel()
    torch.testing.assert_close(res.out, explicit(q, k, v, True, 0.3, keep)[0], rtol=1e-5, atol=1e-6)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    torch.autograd.backward(explicit(*leaves, True, 0.3, keep)[0], dout)
    got = block_backward(q, k, v, res.out, dout, res.lse, causal=True, scale=0.3, dropout=0.25, state=res.state)
    for a, leaf in zip(got, leaves):
        torch.testing.assert_close(a, leaf.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_block_npu_path_translation(causal):
    fwd, bwd = CallLog(reference_npu_fusion_attention), CallLog(reference_npu_fusion_attention_grad)
    kernels = KernelTable({"npu_fusion_attention": fwd, "npu_fusion_attention_grad": bwd})
    q, k, v, dout = _inputs(3)
    res = block_forward(q, k, v, causal=causal, scale=0.3, kernels=kernels)
    cpu = block_forward(q, k, v, causal=causal, scale=0.3)
    torch.testing.assert_close(res.out, cpu.out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.lse, cpu.lse, rtol=1e-5, atol=1e-6)
    got = block_backward(q, k, v, res.out, dout, res.lse, causal=causal, scale=0.3, state=res.state, kernels=kernels)
    ref = block_backward(q, k, v, cpu.out, dout, cpu.lse, causal=causal, scale=0.3)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b, rtol=1e-5, atol=1e-5)
    (f,), (b,) = fwd.calls, bwd.calls
    assert f["args"][3:5] == (4, "BSND") and f["sparse_mode"] == (3 if causal else 0) and f["keep_prob"] == 1.0
    assert b["args"][4:6] == (4, "BSND") and b["sparse_mode"] == f["sparse_mode"] and b["scale_value"] == 0.3
    # the merged statistics go in as softmax_max = lse, softmax_sum = 1, (b, n, sq, 8)
    assert tuple(b["softmax_max"].shape) == (2, 4, 6, 8) and bool((b["softmax_sum"] == 1).all())


# -- every comm type over gloo -----------------------------------------------------------------

def _cp_worker(rank, world, port, out_dir):
    import torch.distributed as dist

    import ascend_patch
    from ascend_patch.config import Settings
    from ascend_patch.backend import cpu_backend, using_target
    from ascend_patch.ops.context_parallel import context_parallel_attention, load_balanced_chunks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ascend_patch.apply(Settings(device="cpu"))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        groups = {"cp4": dist.new_group([0, 1, 2, 3]), "cp2": dist.new_group([0, 1]),
                  "inner": [dist.new_group([0, 1]), dist.new_group([2, 3])],
                  "outer": [dist.new_group([0, 2]), dist.new_group([1, 3])]}
        torch.manual_seed(5)  # the same full tensors on every rank
        s, b, h, g, d = 16, 2, 4, 4, 8
        full = {"q": torch.randn(b, s, h, d), "k": torch.randn(b, s, g, d), "v": torch.randn(b, s, g, d),
                "dout": torch.randn(b, s, h, d)}
        results = {}
        # the npu path: reference kernels of npu_fusion_attention(_grad) in the kernel table of a target that
        # is made the active one for those runs (outside them, the applied cpu target: no kernels)
        npu = cpu_backend("tests: the npu_fusion_attention(_grad) references")
        npu.kernels = KernelTable({"npu_fusion_attention": reference_npu_fusion_attention,
                                   "npu_fusion_attention_grad": reference_npu_fusion_attention_grad})
        runs = [("p2p", "cp4", 4, None), ("all_gather", "cp4", 4, None), ("a2a", "cp4", 4, None),
                ("a2a+p2p", "cp4", 4, None), ("p2p", "cp2", 2, None), ("p2p", "cp4", 4, npu),
                ("a2a+p2p", "cp4", 4, npu)]
        for comm, name, size, target in runs:
            for causal in (True, False):
                if rank >= size:
                    continue
                group = groups[name]
                if comm == "a2a+p2p":
                    group = [groups["inner"][rank // 2], groups["outer"][rank % 2]]
                chunks = {n: t.chunk(2 * size, 1) for n, t in full.items()}
                mine = load_balanced_chunks(rank, size)
                local = {n: torch.cat([c[mine[0]], c[mine[1]]], 1).clone() for n, c in chunks.items()}
                leaves = [local[n].requires_grad_(True) for n in "qkv"]
                with using_target(target) if target is not None else contextlib.nullcontext():
                    out = context_parallel_attention(*leaves, comm_type=comm, group=group, causal=causal, scale=0.3,
                                                     global_ranks=list(range(size)))
                    out.backward(local["dout"])
                key = (comm, size, causal, "npu" if target is not None else "cpu")
                results[key] = {"out": out.detach(), **{f"d{n}": t.grad for n, t in zip("qkv", leaves)}}
        torch.save({"results": results, "full": full}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    finally:
        ascend_patch.remove()


@pytest.mark.slow
def test_every_comm_type_equals_full_attention_forward_and_backward(tmp_path):
    import torch.multiprocessing as mp

    from helpers import free_port

    mp.spawn(_cp_worker, args=(4, free_port(), str(tmp_path)), nprocs=4, join=True)
    saved = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    full = saved[0]["full"]
    for causal in (True, False):
        leaves = [full[n].clone().requires_grad_(True) for n in "qkv"]
        ref_out, _ = explicit(*leaves, causal, 0.3)
        ref_out.backward(full["dout"])
        reference = {"out": ref_out.detach(), **{f"d{n}": t.grad for n, t in zip("qkv", leaves)}}
        for comm, size, path in (("p2p", 4, "cpu"), ("all_gather", 4, "cpu"), ("a2a", 4, "cpu"),
                                 ("a2a+p2p", 4, "cpu"), ("p2p", 2, "cpu"), ("p2p", 4, "npu"), ("a2a+p2p", 4, "npu")):
            for rank in range(size):
                got = saved[rank]["results"][(comm, size, causal, path)]
                for name, tensor in reference.items():
                    c = tensor.chunk(2 * size, 1)
                    expected = torch.cat([c[rank], c[2 * size - 1 - rank]], 1)
                    torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-5,
                                               msg=f"{comm} CP{size} {path} causal={causal} rank {rank} {name}")
