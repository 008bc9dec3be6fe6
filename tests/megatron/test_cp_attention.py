"""ContextParallelAttention against an explicit softmax attention, on the cpu path and through
the npu path with a reference implementation of torch_npu.npu_fusion_attention injected
into the kernel table; and context parallelism over two processes, forward and backward."""

from __future__ import annotations

import os

import pytest
import torch

from ascend_patch.backend import KernelTable, cpu_backend, using_target
from ascend_patch.models.attention import attend

from mcore_run import mcore_world  # noqa: F401  (fixture)


def _with_kernel(kernel):
    """A target whose kernel table holds ``kernel`` as npu_fusion_attention (made active with using_target)."""
    target = cpu_backend("tests: an npu_fusion_attention reference")
    target.kernels = KernelTable({"npu_fusion_attention": kernel})
    return target


def explicit_attention(q, k, v, causal, scale):
    """Textbook attention. q [b, sq, n, d], k/v [b, sk, g, d]; causal is bottom-right aligned."""
    n, g = q.shape[2], k.shape[2]
    k = k.repeat_interleave(n // g, dim=2)
    v = v.repeat_interleave(n // g, dim=2)
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.einsum("bnqk,bknd->bqnd", scores.softmax(-1), v)


def reference_npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                                   atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                                   next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                                   actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    """A reference of torch_npu.npu_fusion_attention's documented semantics (BSND layout only):
    atten_mask True = masked out; sparse_mode 0 uses the mask as given, 2/3 take the compressed
    2048x2048 upper-triangular mask and mean left-up / right-down aligned causal."""
    if input_layout != "BSND":
        raise NotImplementedError(f"the reference implements BSND only, got {input_layout}")
    if keep_prob != 1.0:
        raise NotImplementedError("the reference has no dropout")
    b, sq, n, d = query.shape
    sk, g = key.shape[1], key.shape[2]
    assert n == head_num and n % g == 0
    k = key.repeat_interleave(n // g, dim=2)
    v = value.repeat_interleave(n // g, dim=2)
    scores = torch.einsum("bqnd,bknd->bnqk", query, k) * scale
    if sparse_mode in (2, 3):
        assert atten_mask is not None and atten_mask.shape == (2048, 2048)
        assert torch.equal(atten_mask, torch.ones(2048, 2048, dtype=torch.bool).triu(1))
        shift = sk - sq if sparse_mode == 3 else 0
        masked = torch.ones(sq, sk, dtype=torch.bool).triu(1 + shift)
    elif sparse_mode == 0:
        masked = atten_mask if atten_mask is not None else torch.zeros(sq, sk, dtype=torch.bool)
    else:
        raise NotImplementedError(f"sparse_mode {sparse_mode}")
    scores = scores.masked_fill(masked, float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    total = (scores - peak).exp().sum(-1, keepdim=True)
    out = torch.einsum("bnqk,bknd->bqnd", scores.softmax(-1), v)
    return out, peak.expand(b, n, sq, 8), total.expand(b, n, sq, 8), torch.empty(0), 0, 0, 0


@pytest.mark.parametrize("sq, sk, causal", [(8, 8, True), (4, 12, True), (8, 8, False), (4, 12, False)])
def test_attend_cpu_path(sq, sk, causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, sq, 4, 8), torch.randn(2, sk, 2, 8), torch.randn(2, sk, 2, 8)
    torch.testing.assert_close(attend(q, k, v, causal, 0.3), explicit_attention(q, k, v, causal, 0.3),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sq, sk, causal", [(8, 8, True), (4, 12, True), (6, 6, False)])
def test_attend_npu_path_translation(sq, sk, causal):
    calls = []

    def kernel(*args, **kwargs):
        calls.append((args[3:5], kwargs))
        return reference_npu_fusion_attention(*args, **kwargs)

    torch.manual_seed(1)
    q, k, v = torch.randn(2, sq, 4, 8), torch.randn(2, sk, 2, 8), torch.randn(2, sk, 2, 8)
    with using_target(_with_kernel(kernel)):
        got = attend(q, k, v, causal, 0.25)
    torch.testing.assert_close(got, explicit_attention(q, k, v, causal, 0.25), rtol=1e-5, atol=1e-6)
    (head_num, layout), kwargs = calls[0]
    assert (head_num, layout) == (4, "BSND") and kwargs["scale"] == 0.25 and kwargs["keep_prob"] == 1.0
    assert kwargs["sparse_mode"] == (3 if causal else 0)
    assert (kwargs["atten_mask"] is not None) is causal


def _config(cp=1):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                             kv_channels=16, context_parallel_size=cp, attention_dropout=0.0,
                             hidden_dropout=0.0)


def test_module_uses_the_targets_kernel_and_backpropagates(mcore_world):
    from megatron.core.transformer.enums import AttnMaskType

    from ascend_patch import active_backend
    from ascend_patch.models.attention import ContextParallelAttention

    layer = ContextParallelAttention(_config(), 1, AttnMaskType.causal, "self")
    torch.manual_seed(2)
    q = torch.randn(10, 2, 4, 16, requires_grad=True)
    k = torch.randn(10, 2, 2, 16, requires_grad=True)
    v = torch.randn(10, 2, 2, 16, requires_grad=True)
    plain = layer(q, k, v, None)
    expected = explicit_attention(*(t.transpose(0, 1) for t in (q, k, v)), True, 0.25).transpose(0, 1)
    torch.testing.assert_close(plain, expected.reshape(10, 2, 64), rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(plain.sum(), (q, k, v))
    calls = []

    def kernel(*args, **kwargs):
        calls.append(kwargs["sparse_mode"])
        return reference_npu_fusion_attention(*args, **kwargs)

    with active_backend().kernels.override(npu_fusion_attention=kernel):
        through_kernel = layer(q, k, v, None)
    assert calls == [3]
    torch.testing.assert_close(through_kernel, plain, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(through_kernel.sum(), (q, k, v)), grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _cp_worker(rank, world, port, out_dir):
    import ascend_patch
    import torch.distributed as dist
    from ascend_patch.config import Settings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ascend_patch.apply(Settings(device="cpu"))
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from ascend_patch.models.attention import ContextParallelAttention

    dist.init_process_group("nccl", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(context_parallel_size=world)
    torch.manual_seed(5)  # the same full tensors on every rank
    full = {"q": torch.randn(16, 2, 4, 16), "k": torch.randn(16, 2, 2, 16), "v": torch.randn(16, 2, 2, 16),
            "g": torch.randn(16, 2, 64)}
    chunks = {name: t.chunk(2 * world, 0) for name, t in full.items()}
    local = {name: torch.cat([c[rank], c[2 * world - 1 - rank]]).clone() for name, c in chunks.items()}
    for name in "qkv":
        local[name].requires_grad_(True)
    layer = ContextParallelAttention(_config(world), 1, AttnMaskType.causal, "self")
    out = layer(local["q"], local["k"], local["v"], None)
    out.backward(local["g"])
    torch.save({"out": out.detach(), **{f"d{n}": local[n].grad for n in "qkv"}, "full": full},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_cp2_forward_and_backward_match_full_attention(tmp_path):
    import torch.multiprocessing as mp

    from mcore_run import free_port

    mp.spawn(_cp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    full = results[0]["full"]
    q, k, v = (full[n].clone().requires_grad_(True) for n in "qkv")
    ref = explicit_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), True, 0.25)
    ref = ref.transpose(0, 1).reshape(16, 2, 64)
    ref.backward(full["g"])
    reference = {"out": ref.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for rank, got in enumerate(results):
        for name, tensor in reference.items():
            c = tensor.chunk(4, 0)
            expected = torch.cat([c[rank], c[3 - rank]])
            torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {name}")


@pytest.mark.parametrize("h, hk, d", [(4, 2, 800), (264, 264, 8)])
def test_attend_outside_the_kernels_limits_falls_back_to_torch(h, hk, d):
    """The ops' npu_supports check (head dim <= 768, <= 256 query heads) decides: outside it, SDPA runs."""
    from ascend_patch.ops import attention_npu

    calls = []

    def kernel(*args, **kwargs):
        calls.append(1)
        return reference_npu_fusion_attention(*args, **kwargs)

    torch.manual_seed(2)
    q, k, v = torch.randn(1, 6, h, d), torch.randn(1, 6, hk, d), torch.randn(1, 6, hk, d)
    assert not attention_npu.npu_supports(q, k)
    with using_target(_with_kernel(kernel)):
        got = attend(q, k, v, True, 0.1)
    assert calls == []
    torch.testing.assert_close(got, explicit_attention(q, k, v, True, 0.1), rtol=1e-5, atol=1e-5)
    inside = q[:, :, :4, :64], k[:, :, :2, :64], v[:, :, :2, :64]
    with using_target(_with_kernel(kernel)):
        attend(*inside, True, 0.1)
    assert calls == [1]  # the same call within the limits goes to the kernel
