"""The TE layer's MoE permutations on the npu path: torch_npu's npu_moe_token_permute / unpermute.

The kernels are tests/ops/npu_references_moe.py's references of the documented semantics, injected into a
target's kernel table; the cpu path (no kernels) is the yardstick. The call shapes are megatron-core's:
the alltoall dispatcher permutes with probabilities and ``num_out_tokens = tokens * topk`` and unpermutes
without them; the allgather dispatcher permutes without probabilities, ``num_out_tokens`` a tensor.
Verified with reference kernels on cpu only, never on NPU hardware.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from npu_references import CallLog
from npu_references_moe import reference_npu_moe_token_permute, reference_npu_moe_token_unpermute

from ascend_patch import usage
from ascend_patch.adaptors.megatron.te import permutation as P
from ascend_patch.backend import cpu_backend, using_target


def routing(tokens, experts, topk, dropped=()):
    logits = torch.randn(tokens, experts)
    top = logits.topk(topk, dim=1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, top, True)
    routing_map[list(dropped)] = False
    return routing_map, torch.softmax(logits, dim=-1) * routing_map


@pytest.fixture
def npu():
    """A target whose kernel table holds the two references, each behind a call log; ops run on it under
    ``on(target)``, and on the pure-torch reference outside (nothing is applied)."""
    logs = {"permute": CallLog(reference_npu_moe_token_permute),
            "unpermute": CallLog(reference_npu_moe_token_unpermute)}
    target = cpu_backend("tests: the npu_moe_token_(un)permute references")
    with target.kernels.override(npu_moe_token_permute=logs["permute"], npu_moe_token_unpermute=logs["unpermute"]):
        yield target, logs


def on(target):
    """``target`` active inside the block; None: the reference (nothing applied)."""
    return using_target(target) if target is not None else contextlib.nullcontext()


@pytest.fixture
def recorded():
    previous = usage.active_recorder()
    recorder = usage.UsageRecorder()
    usage.set_recorder(recorder)
    yield recorder
    usage.set_recorder(previous)


def grads(outputs, inputs):
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, weights)


def alltoall(x, probs, routing_map, topk, target):
    """The alltoall dispatcher's calls: permute with probs, experts (x2), unpermute without probs."""
    with on(target):
        permuted, permuted_probs, row_map = P.moe_permute_with_probs(x, probs, routing_map,
                                                                     num_out_tokens=x.shape[0] * topk)
        out = P.moe_unpermute(permuted * 2.0, row_map, merging_probs=None, restore_shape=x.shape)
    return permuted, permuted_probs, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alltoall_calls_take_the_kernels_and_give_the_cpu_paths_values_and_gradients(npu, seeded, recorded, dtype):
    backend, logs = npu
    routing_map, probs = routing(tokens=9, experts=4, topk=2)
    x = torch.randn(9, 6).to(dtype)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ps = [probs.clone().requires_grad_() for _ in range(2)]
    got, want = alltoall(xs[0], ps[0], routing_map, 2, backend), alltoall(xs[1], ps[1], routing_map, 2, None)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(grads(got, (xs[0], ps[0])), grads(want, (xs[1], ps[1]))):
        assert torch.equal(a, b)
    # (a) the arguments: each token's two experts ascending, int32; every pair kept; no padded mode
    (call,) = logs["permute"].calls
    tokens, indices = call["args"]
    assert tokens is xs[0] and indices.dtype == torch.int32 and indices.shape == (9, 2)
    assert torch.equal(indices.long(), routing_map.nonzero()[:, 1].view(9, 2))
    assert call["num_out_tokens"] == 18 and call["padded_mode"] is False
    (call,) = logs["unpermute"].calls
    permuted, sorted_indices = call["args"]
    assert sorted_indices.dtype == torch.int32 and sorted_indices.shape == (18,)
    assert permuted.dtype == dtype and call["probs"].dtype == dtype and torch.equal(call["probs"], torch.ones(9, 2))
    assert call["padded_mode"] is False and call["restore_shape"] is None
    assert not recorded.uses()  # nothing fell back


@pytest.mark.parametrize("topk", [2, 3])
def test_allgather_calls_and_merging_probs_promote_as_megatron_does(npu, seeded, topk):
    """moe_permute without probs (num_out_tokens a tensor), then unpermute merging fp32 probs into bf16 rows."""
    backend, logs = npu
    routing_map, probs = routing(tokens=11, experts=5, topk=topk)
    x = torch.randn(11, 8).to(torch.bfloat16)
    results = []
    for b in (backend, None):
        xi, pi = x.clone().requires_grad_(), probs.clone().requires_grad_()
        with on(b):
            permuted, row_map = P.moe_permute(xi, routing_map, num_out_tokens=routing_map.sum(dim=0).sum())
            out = P.moe_unpermute(permuted, row_map, merging_probs=pi, restore_shape=xi.shape)
        results.append((permuted, out, *grads((out,), (xi, pi))))
    (permuted, out, dx, dp), (want_permuted, want_out, want_dx, want_dp) = results
    assert torch.equal(permuted, want_permuted) and out.dtype == torch.bfloat16
    exact = topk == 2  # two products sum alike in any order; three may round differently in bf16
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(out, want_out, **tol)
    torch.testing.assert_close(dx, want_dx, **tol)
    torch.testing.assert_close(dp, want_dp, rtol=1e-5, atol=1e-6)
    # megatron's promotion: the bf16 rows are multiplied by fp32 probabilities in fp32
    (call,) = logs["unpermute"].calls
    assert call["args"][0].dtype == torch.float32 and call["probs"].dtype == torch.float32
    assert torch.equal(call["probs"], probs.gather(1, routing_map.nonzero()[:, 1].view(11, topk)))
    assert isinstance(logs["permute"].calls[0]["num_out_tokens"], int)


def test_tokens_without_a_full_topk_keep_the_torch_path_and_say_why(npu, seeded, recorded):
    backend, logs = npu
    routing_map, probs = routing(tokens=7, experts=4, topk=2, dropped=(0, 3))  # capacity dropped them
    x = torch.randn(7, 5)
    with on(backend):
        got = P.moe_permute_with_probs(x, probs, routing_map, num_out_tokens=int(routing_map.sum()))
    want = P.moe_permute_with_probs(x, probs, routing_map, num_out_tokens=int(routing_map.sum()))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with on(backend):
        unpermuted = P.moe_unpermute(got[0], got[2], probs, x.shape)
    assert torch.equal(unpermuted, P.moe_unpermute(want[0], want[2], probs, x.shape))
    with on(backend):
        P.moe_permute(x.double(), routing_map.fill_(False).index_fill_(1, torch.tensor([1, 2]), True))
    assert not logs["permute"].calls and not logs["unpermute"].calls
    reasons = [u.api for u in recorded.uses()]
    assert any("moe_permute_with_probs: npu_moe_token_permute not used (tokens are routed to 0 to 2 experts"
               in r for r in reasons), reasons
    assert any("moe_permute: npu_moe_token_permute not used (tokens are torch.float64" in r for r in reasons), reasons
    assert all(u.action == "emulated" for u in recorded.uses())


def test_the_shim_follows_the_target_and_cpu_changes_nothing(patched, seeded):
    """Through transformer_engine.pytorch.permutation: the kernels of the applied target, none on cpu."""
    import ascend_patch
    import transformer_engine.pytorch.permutation as shim

    routing_map, probs = routing(tokens=6, experts=4, topk=2)
    x = torch.randn(6, 3)
    plain = shim.moe_permute(x, routing_map)
    assert plain[1].shape == (6, 4)  # the torch path's [tokens, experts] map: no kernel on cpu
    log = CallLog(reference_npu_moe_token_permute)
    with ascend_patch.active_backend().kernels.override(npu_moe_token_permute=log,
                                                        npu_moe_token_unpermute=reference_npu_moe_token_unpermute):
        permuted, row_map = shim.moe_permute(x, routing_map, num_out_tokens=12)
        back = shim.moe_unpermute(permuted, row_map, probs, restore_shape=x.shape)
    assert len(log.calls) == 1 and row_map.shape == (2, 6, 2) and torch.equal(permuted, plain[0])
    assert torch.equal(back, P.moe_unpermute(plain[0], plain[1], probs, x.shape))
    # the layer's own functions: they read the target at call time
    assert shim.moe_permute is P.moe_permute and shim.moe_sort_chunks_by_index is P.moe_sort_chunks_by_index


def test_the_kernels_documented_limits_and_a_missing_unpermute_keep_the_torch_path(target, seeded, recorded):
    log = CallLog(reference_npu_moe_token_permute)
    x = torch.randn(2, 3)
    every_expert = torch.ones(2, 513, dtype=torch.bool)  # top-513: over the kernels' top-k limit of 512
    with target.kernels.override(npu_moe_token_permute=log,
                                      npu_moe_token_unpermute=reference_npu_moe_token_unpermute):
        permuted, row_map = P.moe_permute(x, every_expert)
    assert row_map.shape == (2, 513) and torch.equal(permuted, P.moe_permute(x, every_expert)[0])
    routing_map, _ = routing(tokens=4, experts=4, topk=2)
    with target.kernels.override(npu_moe_token_permute=log):  # an older torch_npu: permute without unpermute
        permuted, row_map = P.moe_permute(torch.randn(4, 3), routing_map)
    assert row_map.shape == (4, 4) and not log.calls
    reasons = [u.api for u in recorded.uses()]
    assert any("(top-513 routing; the kernel takes top-k <= 512)" in r for r in reasons), reasons
    assert any("(torch_npu has no npu_moe_token_unpermute to undo it)" in r for r in reasons), reasons


def test_a_kernel_row_map_unpermutes_by_the_documented_formula_once_the_kernels_are_gone(npu, seeded):
    backend, logs = npu
    routing_map, probs = routing(tokens=5, experts=4, topk=2)
    x = torch.randn(5, 3)
    with on(backend):
        permuted, row_map = P.moe_permute(x, routing_map)
    want = P.moe_unpermute(*P.moe_permute(x, routing_map), probs, x.shape)
    assert torch.equal(P.moe_unpermute(permuted, row_map, probs, x.shape), want)  # nothing applied: torch
    with on(backend):
        assert torch.equal(P.moe_unpermute(permuted, row_map, probs, x.shape), want)
    assert len(logs["unpermute"].calls) == 1
