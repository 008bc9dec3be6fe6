"""The TE layer's MoE permutations, router and parallel cross entropy against megatron-core's unfused functions.

megatron-core's ``--moe-permute-fusion`` swaps ``moe_utils.permute`` / ``unpermute`` /
``sort_chunks_by_idxs`` for ``transformer_engine.pytorch.permutation``'s functions,
``--moe-router-fusion`` swaps ``topk_routing_with_score_function`` /
``compute_routing_scores_for_aux_loss`` / ``switch_load_balancing_loss_func`` for
``transformer_engine.pytorch.router``'s, and ``--cross-entropy-fusion-impl te`` swaps ``vocab_parallel_cross_entropy`` for
``transformer_engine.pytorch.cross_entropy.parallel_cross_entropy``: each pair must give the same
values and gradients (the Megatron-LM run with the flags is in tests/megatron_lm/test_moe_ep.py).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.multiprocessing as mp

from helpers import free_port


@pytest.fixture
def te(patched):
    spec = importlib.util.find_spec("transformer_engine")
    if spec is not None and not str(spec.origin).startswith("ascend_patch shim"):
        pytest.skip("transformer_engine is really installed here")
    import transformer_engine.pytorch as tep

    return tep


def routing(tokens=7, experts=4, topk=2, dropped=()):
    """A top-k routing map and probabilities; ``dropped`` tokens lose every expert, as capacity may do."""
    logits = torch.randn(tokens, experts)
    top = logits.topk(topk, dim=1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, top, True)
    routing_map[list(dropped)] = False
    probs = torch.softmax(logits, dim=-1) * routing_map
    return routing_map, probs


def grads(outputs, inputs, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, weights)


@pytest.mark.parametrize("dropped", [(), (0, 3)])  # tokens 0 and 3 go nowhere
def test_permute_then_unpermute_with_probs_is_megatrons_unfused_pair(te, seeded, dropped):
    from megatron.core.transformer.moe import moe_utils

    from transformer_engine.pytorch import permutation as P

    routing_map, probs = routing(dropped=dropped)
    x = torch.randn(7, 6)
    n = int(routing_map.sum())

    def fused(x, probs):
        permuted, permuted_probs, row_map = P.moe_permute_with_probs(x, probs, routing_map, num_out_tokens=n)
        out = P.moe_unpermute(permuted * 2.0, row_map, merging_probs=probs, restore_shape=x.shape)
        return permuted, permuted_probs, out

    def unfused(x, probs):
        permuted, permuted_probs, order = moe_utils.permute(x, routing_map, probs=probs, num_out_tokens=n)
        out = moe_utils.unpermute(permuted * 2.0, order, x.shape, probs=probs, routing_map=routing_map)
        return permuted, permuted_probs, out

    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ps = [probs.clone().requires_grad_(), probs.clone().requires_grad_()]
    got, want = fused(xs[0], ps[0]), unfused(xs[1], ps[1])
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert got[0].shape == (n, 6)
    if dropped:
        assert torch.count_nonzero(got[2][[0, 3]]) == 0  # a token with no expert comes back as zeros
    for a, b in zip(grads(got, (xs[0], ps[0])), grads(want, (xs[1], ps[1]))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_permute_and_unpermute_without_probs_are_megatrons(te, seeded):
    from megatron.core.transformer.moe import moe_utils

    from transformer_engine.pytorch import permutation as P

    routing_map, _ = routing(tokens=9, experts=3, topk=2)
    x = torch.randn(9, 5, dtype=torch.float32)
    permuted, row_map = P.moe_permute(x, routing_map)
    want, _, order = moe_utils.permute(x, routing_map)
    assert torch.equal(permuted, want)
    assert torch.equal(P.moe_unpermute(permuted, row_map), moe_utils.unpermute(want, order, x.shape))
    # every token's top-2 rows summed back: twice the token
    assert torch.allclose(P.moe_unpermute(permuted, row_map), 2 * x)
    with pytest.raises(NotImplementedError, match="map_type='index'"):
        P.moe_permute(x, routing_map, map_type="index")


def test_sort_chunks_by_index_is_megatrons(te, seeded):
    from megatron.core.transformer.moe import moe_utils

    from transformer_engine.pytorch import permutation as P

    split_sizes = torch.tensor([2, 0, 3, 1, 4, 2])  # [ranks=3, local experts=2], as the alltoall dispatcher has
    order = torch.arange(6).reshape(-1, 2).T.ravel()
    x = torch.randn(12, 4, requires_grad=True)
    probs = torch.rand(12, requires_grad=True)
    got, got_probs = P.moe_sort_chunks_by_index_with_probs(x, probs, split_sizes, order)
    want, want_probs = moe_utils.sort_chunks_by_idxs(x, split_sizes, order, probs=probs)
    assert torch.equal(got, want) and torch.equal(got_probs, want_probs)
    assert torch.equal(P.moe_sort_chunks_by_index(x, split_sizes, order), want)
    assert torch.equal(got[:5], x[:5]) and torch.equal(got[5:9], x[6:10])  # expert 0 of ranks 0, 1, 2 first
    for a, b in zip(grads((got, got_probs), (x, probs)), grads((want, want_probs), (x, probs))):
        assert torch.equal(a, b)


ROUTINGS = {  # name -> keyword arguments of megatron's topk_routing_with_score_function
    "softmax": {"score_function": "softmax"},
    "pre-softmax, scaled": {"score_function": "softmax", "use_pre_softmax": True, "scaling_factor": 2.5},
    "sigmoid with expert bias": {"score_function": "sigmoid", "expert_bias": "bias"},
    "sigmoid, groups": {"score_function": "sigmoid", "num_groups": 4, "group_topk": 2},
    "softmax, groups": {"score_function": "softmax", "num_groups": 2, "group_topk": 1, "use_pre_softmax": True},
}


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_fused_topk_routing_is_megatrons_unfused_routing(te, seeded, name):
    from megatron.core.transformer.moe import moe_utils

    from transformer_engine.pytorch import router

    kwargs = dict(ROUTINGS[name])
    if kwargs.get("expert_bias") == "bias":
        kwargs["expert_bias"] = torch.randn(8) * 0.5  # moves the choice, not the weights
    logits = torch.randn(11, 8)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got = router.fused_topk_with_score_function(logits=a, topk=4, **kwargs)
    want = moe_utils.topk_routing_with_score_function(b, 4, **kwargs)
    assert torch.equal(got[1], want[1]) and got[1].sum() == 11 * 4
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(grads((got[0],), (a,))[0], grads((want[0],), (b,))[0], rtol=0, atol=0)


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_fused_aux_loss_scores_and_loss_are_megatrons(te, seeded, score_function):
    from megatron.core.transformer.moe import moe_utils

    from transformer_engine.pytorch import router

    logits = torch.randn(10, 6)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got_map, got_scores = router.fused_compute_score_for_moe_aux_loss(logits=a, topk=2, score_function=score_function)
    want_map, want_scores = moe_utils.compute_routing_scores_for_aux_loss(b, 2, score_function)
    assert torch.equal(got_map, want_map) and torch.equal(got_scores, want_scores)
    tokens = want_map.sum(dim=0)
    got = router.fused_moe_aux_loss(probs=got_scores, tokens_per_expert=tokens, total_num_tokens=10, topk=2,
                                    num_experts=6, coeff=1e-2)
    want = moe_utils.switch_load_balancing_loss_func(want_scores, tokens, 10, 2, 6, 1e-2)
    assert torch.equal(got, want) and 0.9e-2 < got.item() < 1.5e-2  # about coeff for a fresh router
    torch.testing.assert_close(torch.autograd.grad(got, a)[0], torch.autograd.grad(want, b)[0], rtol=0, atol=0)


def _cross_entropy_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from ascend_patch.adaptors.megatron.te.cross_entropy import parallel_cross_entropy

    torch.manual_seed(0)
    logits = torch.randn(5, 3, 16, dtype=torch.float32)  # [s, b, vocab]
    target = torch.randint(0, 16, (5, 3))
    target[1, 2] = -100  # ignored
    part = logits.chunk(world, dim=-1)[rank].clone().requires_grad_()
    loss = parallel_cross_entropy(part, target, 0.0, False, dist.group.WORLD)
    (loss * torch.arange(15, dtype=torch.float32).view(5, 3)).sum().backward()
    torch.save({"loss": loss.detach(), "grad": part.grad}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_parallel_cross_entropy_over_two_vocabulary_shards_is_the_full_loss(tmp_path):
    mp.spawn(_cross_entropy_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    logits = torch.randn(5, 3, 16, dtype=torch.float32, requires_grad=True)
    target = torch.randint(0, 16, (5, 3))
    target[1, 2] = -100
    want = torch.nn.functional.cross_entropy(logits.view(15, 16), target.view(15), reduction="none",
                                             ignore_index=-100).view(5, 3)
    (want * torch.arange(15, dtype=torch.float32).view(5, 3)).sum().backward()
    shards = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for shard in shards:
        torch.testing.assert_close(shard["loss"], want.detach(), rtol=1e-5, atol=1e-6)
        assert shard["loss"][1, 2] == 0
    torch.testing.assert_close(torch.cat([s["grad"] for s in shards], dim=-1), logits.grad, rtol=1e-5, atol=1e-6)


def test_parallel_cross_entropy_is_megatrons_vocab_parallel_loss(te, seeded, tmp_path):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        logits = torch.randn(6, 2, 32)
        target = torch.randint(0, 32, (6, 2))
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        # megatron-core's call with TE < 2.7 (five arguments)
        got = parallel_cross_entropy(a, target, 0.0, False, parallel_state.get_tensor_model_parallel_group())
        want = vocab_parallel_cross_entropy(b.clone(), target)  # megatron's subtracts in place: its own copy
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        ga, gb = grads((got,), (a,)), grads((want,), (b,))
        torch.testing.assert_close(ga[0], gb[0], rtol=1e-6, atol=1e-6)
        assert torch.equal(a.detach(), logits)  # the caller's logits are left alone
        with pytest.raises(NotImplementedError, match="label_smoothing"):
            parallel_cross_entropy(a, target, 0.1)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
