"""Model specs: --spec resolution (both forms, unknown names, a third-party plugin from a real
dist-info on sys.path), the layer specs the families build, and a model built from them."""

from __future__ import annotations

import sys

import pytest
import torch

from ascend_patch.models.registry import UnknownSpec, get_spec_registry, resolve_spec
from mcore_run import mcore_world  # noqa: F401  (fixture)


def test_spec_by_name_and_alias():
    spec = resolve_spec("qwen3")
    assert spec.name == "qwen3" and "qwen3" in spec.hf_model_types
    assert resolve_spec(["qwen2.5"]).name == "qwen2"
    assert resolve_spec("Mistral").name == "llama"


def test_spec_in_megatrons_module_attribute_form():
    from ascend_patch.models.qwen3.spec import layer_spec

    assert resolve_spec(["ascend_patch.models.qwen3.spec", "layer_spec"]) is layer_spec
    assert resolve_spec("ascend_patch.models.qwen3.spec layer_spec") is layer_spec
    with pytest.raises(UnknownSpec, match="cannot import no_such_module"):
        resolve_spec(["no_such_module", "layer_spec"])
    with pytest.raises(UnknownSpec, match="has no attribute 'nope'"):
        resolve_spec(["ascend_patch.models.qwen3.spec", "nope"])


def test_unknown_spec_lists_the_known_ones():
    with pytest.raises(UnknownSpec, match=r"unknown model spec 'qwen4'; known: gpt, llama, mixtral, qwen2, qwen3, qwen3_moe"):
        resolve_spec("qwen4")


_PLUGIN = '''
from ascend_patch.hookspec import hookimpl
from ascend_patch.models.hf_config import load_hf_config
from ascend_patch.models.registry import ModelSpec


def config_from_hf(cfg):
    return load_hf_config(cfg, "tinyfam", qk_layernorm=True)


def layer_spec(model_config=None):
    from ascend_patch.models.layer_spec import dense_layer_spec
    return dense_layer_spec("RMSNorm", qk_layernorm=True)


@hookimpl
def ascend_patch_model_specs():
    return [ModelSpec(name="tinyfam", config_from_hf=config_from_hf, hf_model_types=("tinyfam",),
                      hf_architectures=("TinyFamForCausalLM",), description="a third-party family",
                      layer_spec=layer_spec)]
'''


@pytest.fixture
def third_party_family(tmp_path, monkeypatch):
    """A distribution installed the way pip installs one: a package and its dist-info with an
    ``ascend_patch`` entry point, on sys.path."""
    from ascend_patch.plugins import reset_plugin_manager

    (tmp_path / "tinyfam_plugin").mkdir()
    (tmp_path / "tinyfam_plugin" / "__init__.py").write_text(_PLUGIN)
    info = tmp_path / "tinyfam_plugin-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyfam-plugin\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\ntinyfam = tinyfam_plugin\n")
    (info / "RECORD").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = reset_plugin_manager(None)
    try:
        yield
    finally:
        reset_plugin_manager(previous)
        get_spec_registry(refresh=True)
        sys.modules.pop("tinyfam_plugin", None)


def test_third_party_spec_from_an_installed_distribution(third_party_family):
    from ascend_patch.plugins import get_plugin_manager

    pm = get_plugin_manager()
    assert "tinyfam" in pm.names() and pm.origins["tinyfam"] == "tinyfam-plugin"
    registry = get_spec_registry(refresh=True)
    assert registry.known() == ["gpt", "llama", "mixtral", "qwen2", "qwen3", "qwen3_moe", "tinyfam"]
    spec = resolve_spec("tinyfam")
    assert spec.owner == "tinyfam" and spec.description == "a third-party family"
    found = registry.for_hf_config({"architectures": ["TinyFamForCausalLM"], "model_type": "tinyfam"})
    assert found is spec
    mc = spec.config_from_hf({"model_type": "tinyfam", "num_attention_heads": 4, "hidden_size": 64,
                              "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100})
    assert mc.family == "tinyfam" and mc.qk_layernorm


def test_family_layer_specs():
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from ascend_patch.models.attention import ContextParallelAttention

    for name, qk in (("gpt", False), ("llama", False), ("qwen2", False), ("qwen3", True)):
        spec = resolve_spec(name).layer_spec(None)
        attention = spec.submodules.self_attention.submodules
        assert attention.core_attention is ContextParallelAttention, name
        assert (attention.q_layernorm is not IdentityOp) is qk, name
        assert (attention.k_layernorm is not IdentityOp) is qk, name
    qwen3 = resolve_spec("qwen3").layer_spec(None).submodules
    assert qwen3.input_layernorm is WrappedTorchNorm
    # a config asking for q/k norm turns it on in a family that has none by default
    llama = resolve_spec("llama").layer_spec(type("C", (), {"qk_layernorm": True, "normalization": "RMSNorm"})())
    assert llama.submodules.self_attention.submodules.q_layernorm is not IdentityOp


def _qwen3_tiny():
    from ascend_patch.models.qwen3.config import config_from_hf

    return config_from_hf({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                           "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 200,
                           "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000,
                           "tie_word_embeddings": False, "torch_dtype": "float32"})


def test_qwen3_spec_model_matches_megatrons_local_spec(mcore_world):
    """The same weights in a GPTModel built from the qwen3 spec and from megatron-core's local
    spec (its DotProductAttention) give the same logits and gradients."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from ascend_patch.models.transformer_config import gpt_model_kwargs, transformer_config

    mc = _qwen3_tiny()
    config = transformer_config(mc, use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0)
    ours = GPTModel(config, resolve_spec("qwen3").layer_spec(mc), **gpt_model_kwargs(mc))
    stock = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"),
                     **gpt_model_kwargs(mc))
    stock.load_state_dict(ours.state_dict(), strict=True)
    tokens = torch.randint(0, 200, (2, 16))
    positions = torch.arange(16).expand(2, 16)
    out_ours = ours(tokens, positions, None)
    out_stock = stock(tokens, positions, None)
    assert out_ours.shape == (2, 16, 256)  # vocab 200 padded to 256
    torch.testing.assert_close(out_ours, out_stock, rtol=1e-5, atol=1e-5)
    out_ours.square().mean().backward()
    out_stock.square().mean().backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), stock.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
