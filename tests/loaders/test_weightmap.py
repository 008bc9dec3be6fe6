"""The declarative weight maps against independent references written here (no files involved)."""

from __future__ import annotations

import pytest
import torch

from ascend_patch.loaders.blocks import BlockFiller
from ascend_patch.loaders.formats import TensorInfo
from ascend_patch.models.hf_config import load_hf_config
from ascend_patch.parallel import Layout, LayoutError
from ascend_patch.models.weightmap import (ExtraState, Piece, TensorPlan, compose,
                                           coverage_gaps, invert, is_padding, padding_key)

H, NH, NG, D, F, V, L = 64, 8, 2, 12, 96, 300, 4


def _cfg(family="qwen3", tied=True, groups=NG, **extra):
    raw = dict(model_type=family, hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=NH,
               num_key_value_heads=groups, head_dim=D, vocab_size=V, tie_word_embeddings=tied, **extra)
    return load_hf_config(raw, family, qk_layernorm=family == "qwen3", add_qkv_bias=family == "qwen2",
                          default_tied=tied)


def _wm(family="qwen3", tied=True, groups=NG):
    from ascend_patch.models.registry import get_spec_registry

    return get_spec_registry().get(family).weight_map(_cfg(family, tied, groups))


def _random_hf(wm):
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=g) for k, s in wm.hf_tensors().items()}


def _memory(tensors):
    return {k: TensorInfo(path="<mem>", shape=tuple(t.shape), dtype="float32",
                          reader=lambda a, b, t=t: t[a:b].clone()) for k, t in tensors.items()}


def _materialise(plan: TensorPlan, tensors) -> torch.Tensor:
    """``plan`` filled from ``tensors`` (key -> tensor); padding rows they do not hold are zeros."""
    import numpy as np

    held = {k: [Piece(k, (0,) * t.dim(), (0,) * t.dim(), tuple(t.shape))] for k, t in tensors.items()}
    plan = compose(plan, held)
    out = np.empty(plan.shape, dtype=np.uint32)  # raw float32 bits
    BlockFiller(_memory(tensors)).fill(plan, 0, plan.shape[0], out, "float32")
    return torch.from_numpy(out.view(np.float32))


def _chunk(wm, layout, t, p, v=0, naming="local", padded=None):
    return {e.key: e for e in wm.megatron_chunk(layout, t, p, v, naming, padded) if isinstance(e, TensorPlan)}


@pytest.mark.parametrize("tp", [1, 2])
def test_qkv_interleaves_per_query_group_then_splits(tp):
    wm = _wm()
    hf = _random_hf(wm)
    layout = Layout.build(L, tp=tp)
    per = NH // NG
    for i in range(L):
        a = f"model.layers.{i}.self_attn."
        ref = torch.cat([hf[a + "q_proj.weight"].view(NG, per * D, H), hf[a + "k_proj.weight"].view(NG, D, H),
                         hf[a + "v_proj.weight"].view(NG, D, H)], dim=1).reshape(-1, H)
        for r, want in enumerate(ref.chunk(tp, 0)):
            plan = _chunk(wm, layout, r, 0)[f"decoder.layers.{i}.self_attention.linear_qkv.weight"]
            assert torch.equal(_materialise(plan, hf), want)


def test_qkv_bias_follows_the_weight_layout():
    wm = _wm("qwen2", tied=False)
    hf = _random_hf(wm)
    per = NH // NG
    a = "model.layers.2.self_attn."
    ref = torch.cat([hf[a + "q_proj.bias"].view(NG, per * D), hf[a + "k_proj.bias"].view(NG, D),
                     hf[a + "v_proj.bias"].view(NG, D)], dim=1).reshape(-1)
    layout = Layout.build(L, tp=2)
    for r, want in enumerate(ref.chunk(2)):
        plan = _chunk(wm, layout, r, 0)["decoder.layers.2.self_attention.linear_qkv.bias"]
        assert torch.equal(_materialise(plan, hf), want)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gated_fc1_row_and_vocab_splits(tp):
    wm = _wm(tied=False, family="llama", groups=4)
    hf = _random_hf(wm)
    layout = Layout.build(L, tp=tp)
    padded = 512
    for r in range(tp):
        chunk = _chunk(wm, layout, r, 0, padded=padded)
        gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
        fc1 = torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]])
        assert torch.equal(_materialise(chunk["decoder.layers.1.mlp.linear_fc1.weight"], hf), fc1)
        assert torch.equal(_materialise(chunk["decoder.layers.1.mlp.linear_fc2.weight"], hf),
                           hf["model.layers.1.mlp.down_proj.weight"].chunk(tp, 1)[r])
        assert torch.equal(_materialise(chunk["decoder.layers.1.self_attention.linear_proj.weight"], hf),
                           hf["model.layers.1.self_attn.o_proj.weight"].chunk(tp, 1)[r])
        emb = torch.cat([hf["model.embed_tokens.weight"], torch.zeros(padded - V, H)])
        assert torch.equal(_materialise(chunk["embedding.word_embeddings.weight"], hf), emb.chunk(tp, 0)[r])
        head = torch.cat([hf["lm_head.weight"], torch.zeros(padded - V, H)])
        assert torch.equal(_materialise(chunk["output_layer.weight"], hf), head.chunk(tp, 0)[r])
        assert torch.equal(_materialise(chunk["decoder.layers.1.input_layernorm.weight"], hf),
                           hf["model.layers.1.input_layernorm.weight"])


def test_layer_placement_even_list_and_virtual():
    even = Layout.build(8, pp=2)
    assert [list(even.layers(p)) for p in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    uneven = Layout.build(8, pp=3, num_layer_list=[2, 4, 2])
    assert [list(uneven.layers(p)) for p in range(3)] == [[0, 1], [2, 3, 4, 5], [6, 7]]
    vpp = Layout.build(8, pp=2, vpp=2)
    # megatron-core: global = v * L/vp + p * L/(PP*vp) + j
    for v in range(2):
        for p in range(2):
            assert list(vpp.layers(p, v)) == [v * 4 + p * 2 + j for j in range(2)]
    with pytest.raises(LayoutError, match="28 layers cannot be split over 8"):
        Layout.build(28, pp=8)


def test_tied_embeddings_on_one_and_on_several_stages():
    wm = _wm()  # qwen3, tied
    one = _chunk(wm, Layout.build(L), 0, 0)
    assert "output_layer.weight" not in one
    entries = wm.megatron_chunk(Layout.build(L), 0, 0)
    assert ExtraState("output_layer._extra_state") in entries
    two = Layout.build(L, pp=2)
    last = _chunk(wm, two, 0, 1, padded=384)
    hf = _random_hf(wm)
    emb = torch.cat([hf["model.embed_tokens.weight"], torch.zeros(384 - V, H)])
    assert torch.equal(_materialise(last["output_layer.weight"], hf), emb)
    assert "lm_head.weight" not in wm.hf_tensors()


def test_te_naming_folds_the_norms():
    wm = _wm()
    keys = {e.key for e in wm.megatron_chunk(Layout.build(L), 0, 0, 0, "te")}
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in keys
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in keys
    assert "decoder.layers.0.self_attention.core_attention._extra_state" in keys
    assert not any(k.endswith("input_layernorm.weight") or k.endswith("pre_mlp_layernorm.weight") for k in keys)


def test_invert_then_compose_reshards_without_hf():
    wm = _wm("qwen2", tied=False)
    hf = _random_hf(wm)
    src_layout = Layout.build(L, tp=2, pp=2)
    plans = {}
    stored = {}
    for (t, p, _), chunks in wm.megatron_ranks(src_layout, padded_vocab=512).items():
        for e in chunks[0]:
            if isinstance(e, TensorPlan):
                pid = f"{t}{p}/{e.key}"
                plans[pid] = e
                stored[pid] = _materialise(e, hf)
    canonical, replicas = invert(plans.items())
    assert coverage_gaps(canonical, wm.hf_tensors()) == {}
    assert replicas  # replicated norms on the second TP rank
    dst = Layout.build(L, tp=1, pp=1)
    for key, plan in _chunk(wm, dst, 0, 0, padded=384).items():
        direct = _materialise(plan, hf)
        via_mg = _materialise(compose(plan, canonical), stored)
        assert torch.equal(direct, via_mg), key
    for key, shape in wm.hf_tensors().items():
        back = TensorPlan(key, shape, tuple(canonical[key]))
        assert torch.equal(_materialise(back, stored), hf[key])


@pytest.mark.parametrize("padded", [384, 512, 768])
def test_compose_carries_the_padding_rows_a_megatron_source_holds(padded):
    wm = _wm("llama", tied=False, groups=4)  # the embedding and the output layer each have padding rows
    hf = _random_hf(wm)
    g = torch.Generator().manual_seed(1)
    pads = {padding_key(k): torch.randn(512 - V, H, generator=g) for k in ("model.embed_tokens.weight", "lm_head.weight")}
    plans, stored = {}, {}
    src_layout = Layout.build(L, tp=2, pp=2)
    for t, p in src_layout.ranks():
        for e in wm.megatron_chunk(src_layout, t, p, 0, "local", 512):
            if isinstance(e, TensorPlan):
                plans[f"{t}{p}/{e.key}"] = e
                stored[f"{t}{p}/{e.key}"] = _materialise(e, {**hf, **pads})
    canonical, _ = invert(plans.items())
    assert sorted(k for k in canonical if is_padding(k)) == sorted(pads)
    assert coverage_gaps(canonical, wm.hf_tensors()) == {}  # the HF tensors alone, as before
    for r in range(2):
        chunk = _chunk(wm, Layout.build(L, tp=2), r, 0, padded=padded)
        for key, hf_key in (("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
                            ("output_layer.weight", "lm_head.weight")):
            full = torch.cat([hf[hf_key], pads[padding_key(hf_key)], torch.zeros(max(0, padded - 512), H)])[:padded]
            assert torch.equal(_materialise(compose(chunk[key], canonical), stored), full.chunk(2)[r]), (key, r)
    # an HF source holds no padding: zeros, and a composed plan names only physical tensors or fills
    composed = compose(_chunk(wm, Layout.build(L), 0, 0, padded=padded)["embedding.word_embeddings.weight"],
                       {k: [Piece(k, (0, 0), (0, 0), tuple(v.shape))] for k, v in hf.items()})
    assert {p.src for p in composed.pieces} == {"model.embed_tokens.weight", None}


def test_split_refusals():
    wm = _wm()
    with pytest.raises(LayoutError, match="query groups"):
        wm.megatron_chunk(Layout.build(L, tp=4), 0, 0, padded_vocab=512)
