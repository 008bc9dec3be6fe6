"""A family is its folder: each declares its whole spec, and nothing else in the package knows it by name."""

from __future__ import annotations

import argparse
import importlib
import os
import types

import pytest

from ascend_patch.models.hf_config import ConfigMismatch
from ascend_patch.models.registry import ArgsMatcher, ModelSpec, UnknownSpec, get_spec_registry
from ascend_patch.registry import DuplicateName

MODELS = os.path.join(os.path.dirname(importlib.import_module("ascend_patch.models").__file__))


def test_every_family_folder_declares_the_spec_the_plugin_collects():
    from ascend_patch.models.plugin import builtin_specs

    folders = sorted(d for d in os.listdir(MODELS)
                     if os.path.isfile(os.path.join(MODELS, d, "__init__.py")))
    specs = builtin_specs()
    assert [s.name for s in specs] == folders == ["gpt", "llama", "mixtral", "qwen2", "qwen3", "qwen3_moe"]
    for spec in specs:
        assert importlib.import_module(f"ascend_patch.models.{spec.name}").SPEC is spec
        assert spec.layer_spec.__qualname__ == f"ascend_patch.models.{spec.name}.spec.layer_spec"
    assert [s.name for s in specs if s.converts] == ["llama", "mixtral", "qwen2", "qwen3", "qwen3_moe"]


@pytest.mark.parametrize("typed,family", [("llama3.1", "llama"), ("Llama-3.1", "llama"), ("llama31", "llama"),
                                          ("llama3.2", "llama"), ("mistral", "llama"), ("qwen2.5", "qwen2"),
                                          ("Qwen2_5", "qwen2"), ("qwen", "qwen2"), ("QWEN3", "qwen3")])
def test_the_spellings_users_type_name_a_family(typed, family):
    assert get_spec_registry().get(typed).name == family


def test_format_names_imply_their_family_and_are_aliases_of_its_format():
    from ascend_patch.loaders.formats import get_format_registry

    registry = get_spec_registry()
    assert registry.for_format_name("QWEN3_HF").name == "qwen3"
    assert registry.for_format_name("llama_mistral").name == "llama"
    assert registry.for_format_name("qwen_hf").name == "qwen2"
    assert registry.for_format_name("hf") is None and registry.for_format_name("mcore") is None
    formats = get_format_registry(refresh=True)
    for name in ("llama3_hf", "qwen2.5_hf", "qwen3_hf"):
        assert formats.loader(name) is formats.loader("hf") and formats.saver(name) is formats.saver("hf")
        assert formats.plugin_of("loader", name) == "loaders"  # the alias belongs to the format's plugin


_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 300}


def test_a_familys_traits_are_stated_once_and_read_by_its_config_weight_map_and_args_facts():
    from ascend_patch.loaders.megatron_args import config_from_args
    from ascend_patch.models.registry import Traits

    registry = get_spec_registry()
    qwen3, qwen2, llama = registry.get("qwen3"), registry.get("qwen2"), registry.get("llama")
    assert qwen3.traits == Traits(qk_norm=True, qkv_bias=None, tied=True)
    assert importlib.import_module("ascend_patch.models.qwen3.config").TRAITS is qwen3.traits
    # the args facts are the traits: a trait stated True/False is a fact, None (as the config says) is not
    assert qwen3.megatron_args == ArgsMatcher({"normalization": "RMSNorm", "swiglu": True, "qk_layernorm": True})
    assert registry.get("mixtral").megatron_args == ArgsMatcher(
        {"normalization": "RMSNorm", "swiglu": True, "qk_layernorm": False, "add_qkv_bias": False},
        patterns={"num_experts": r"^[1-9]"})
    # the config map: q/k norm and the tie default from qwen3's traits, the q/k/v bias from qwen2's
    q3 = qwen3.config_from_hf({**_TINY, "model_type": "qwen3"})
    assert (q3.qk_layernorm, q3.tie_word_embeddings, q3.add_qkv_bias) == (True, True, False)
    q2 = qwen2.config_from_hf({**_TINY, "model_type": "qwen2"})
    assert (q2.qk_layernorm, q2.tie_word_embeddings, q2.add_qkv_bias) == (False, False, True)
    # the weight map follows: qwen3's q/k norms, qwen2's biases, neither for llama
    layer0 = "model.layers.0.self_attn."
    assert {layer0 + "q_norm.weight", layer0 + "k_norm.weight"} <= set(qwen3.weight_map(q3).hf_tensors())
    assert {layer0 + "q_proj.bias", layer0 + "v_proj.bias"} <= set(qwen2.weight_map(q2).hf_tensors())
    assert not [k for k in llama.weight_map(llama.config_from_hf({**_TINY, "model_type": "llama"})).hf_tensors()
                if "norm.weight" in k and "self_attn" in k or k.endswith(".bias")]
    # a Megatron checkpoint of another family forced to llama: what llama never has is refused, not dropped
    forced = config_from_args(_args(normalization="RMSNorm", swiglu=True, qk_layernorm=True, ffn_hidden_size=128,
                                    vocab_size=300), "llama", None)
    with pytest.raises(ConfigMismatch, match="llama models have no q/k layernorm"):
        llama.weight_map(forced)


def _args(**given):
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4)
    return argparse.Namespace(**{**base, **given})


def test_a_megatron_lm_checkpoint_is_recognised_by_its_args():
    registry = get_spec_registry()
    llama_like = dict(normalization="RMSNorm", swiglu=True)
    assert registry.for_megatron_args(_args(**llama_like)).name == "llama"
    assert registry.for_megatron_args(_args(**llama_like, add_qkv_bias=True)).name == "qwen2"
    assert registry.for_megatron_args(_args(**llama_like, qk_layernorm=True)).name == "qwen3"
    assert registry.for_megatron_args(_args(**llama_like, qk_layernorm=True, add_qkv_bias=True)).name == "qwen3"
    # experts make the MoE family of the same attention win (one fact more)
    assert registry.for_megatron_args(_args(**llama_like, num_experts=8)).name == "mixtral"
    assert registry.for_megatron_args(_args(**llama_like, qk_layernorm=True, num_experts=128)).name == "qwen3_moe"
    assert registry.for_megatron_args({"normalization": "LayerNorm"}).name == "gpt"
    assert registry.for_megatron_args(_args()).name == "gpt"  # Megatron's defaults are the classic GPT
    with pytest.raises(ConfigMismatch) as info:
        registry.for_megatron_args(_args(normalization="RMSNorm"))  # RMSNorm without SwiGLU: no family
    assert str(info.value) == (
        "the checkpoint's args (add_qkv_bias=False, normalization='RMSNorm', num_experts=None, qk_layernorm=False, "
        "swiglu=False) matches no family's Megatron arguments; pass --model-type-hf "
        "(gpt, llama, mixtral, qwen2, qwen3, qwen3_moe)")


def test_gpt_builds_but_does_not_convert_and_says_which_families_do():
    from ascend_patch.loaders.resolve import weight_map_for

    gpt = get_spec_registry().get("gpt")
    mc = gpt.config_from_hf({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100})
    with pytest.raises(ConfigMismatch, match="model family gpt has no weight map, so the converter cannot handle it; "
                                             "the families it converts: llama, mixtral, qwen2, qwen3, qwen3_moe"):
        weight_map_for(gpt, mc)


def _family_plugin(**spec_fields):
    from ascend_patch.hookspec import hookimpl
    from ascend_patch.models.llama.config import config_from_hf

    module = types.ModuleType("tinyfam_plugin")

    @hookimpl
    def ascend_patch_model_specs():
        return [ModelSpec(name="tinyfam", config_from_hf=config_from_hf, **spec_fields)]

    module.ascend_patch_model_specs = ascend_patch_model_specs
    return module


@pytest.fixture
def with_plugin():
    """Swap in a plugin manager with the built-ins and one in-process plugin; the process's comes back after."""
    from ascend_patch.loaders.formats import get_format_registry
    from ascend_patch.plugins import PluginManager, reset_plugin_manager

    previous = []

    def install(module):
        pm = PluginManager(entry_points=False)
        pm.register(module, "tinyfam", origin="tinyfam-plugin")
        previous.append(reset_plugin_manager(pm))
        return pm

    yield install
    reset_plugin_manager(previous[0] if previous else None)
    get_spec_registry(refresh=True)
    get_format_registry(refresh=True)


def test_a_third_party_family_brings_its_spellings_format_names_and_args_inference(with_plugin):
    from ascend_patch.loaders.formats import get_format_registry

    with_plugin(_family_plugin(
        aliases=("tiny-fam",), loader_aliases=("tiny_hf",),
        # llama's facts and one of its own: a family refining another lists the other's facts too
        megatron_args=ArgsMatcher({"normalization": "RMSNorm", "swiglu": True, "qk_layernorm": False,
                                   "add_qkv_bias": False}, patterns={"tokenizer_model": r"(?i)tiny"})))
    registry = get_spec_registry(refresh=True)
    spec = registry.get("TinyFam")
    assert registry.get("tiny-fam") is spec and spec.owner == "tinyfam"
    assert registry.for_format_name("tiny_hf") is spec
    formats = get_format_registry(refresh=True)
    assert formats.loader("tiny_hf") is formats.loader("hf")
    # llama's arguments and a tokenizer only this family names: the more specific family wins
    assert registry.for_megatron_args(_args(normalization="RMSNorm", swiglu=True,
                                            tokenizer_model="org/Tiny-1B")) is spec
    assert registry.for_megatron_args(_args(normalization="RMSNorm", swiglu=True,
                                            tokenizer_model="meta-llama/Llama-3.1-8B")).name == "llama"


def test_a_family_claiming_another_familys_format_name_is_refused_naming_both(with_plugin):
    with_plugin(_family_plugin(loader_aliases=("qwen3_hf",)))
    with pytest.raises(DuplicateName) as info:
        get_spec_registry(refresh=True)
    text = str(info.value)
    assert text.startswith("checkpoint format name 'qwen3_hf' is claimed by plugin ")
    assert "plugin models (spec 'qwen3')" in text and "plugin tinyfam (spec 'tinyfam')" in text


def test_a_tie_between_families_is_an_error_naming_them(with_plugin):
    with_plugin(_family_plugin(megatron_args=ArgsMatcher({"normalization": "RMSNorm", "swiglu": True,
                                                          "qk_layernorm": True})))
    registry = get_spec_registry(refresh=True)
    with pytest.raises(ConfigMismatch, match="matches the families qwen3, tinyfam equally"):
        registry.for_megatron_args(_args(normalization="RMSNorm", swiglu=True, qk_layernorm=True))
    with pytest.raises(UnknownSpec, match="unknown model spec 'qwen4'; known: gpt, llama, mixtral, qwen2, qwen3, qwen3_moe, tinyfam"):
        registry.get("qwen4")


def test_dropout_rates_come_from_the_familys_config_map():
    from ascend_patch.models.transformer_config import transformer_config_kwargs

    gpt = get_spec_registry().get("gpt").config_from_hf({"model_type": "gpt2", "n_embd": 64, "n_head": 4,
                                                         "n_layer": 2, "vocab_size": 100, "resid_pdrop": 0.2})
    kwargs = transformer_config_kwargs(gpt)
    assert (kwargs["hidden_dropout"], kwargs["attention_dropout"]) == (0.2, 0.1)  # GPT-2's names and defaults
    llama = get_spec_registry().get("llama").config_from_hf({
        "model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 96, "vocab_size": 100, "attention_dropout": 0.05})
    kwargs = transformer_config_kwargs(llama)
    assert (kwargs["hidden_dropout"], kwargs["attention_dropout"]) == (0.0, 0.05)


def test_no_code_outside_the_family_folders_names_a_family():
    """The converter, check, collectives, parallel rules and the shared model code hold no family's name,
    alias, format name or HF model type as a value (docstrings may give examples)."""
    import ast

    import ascend_patch

    names = set()
    for spec in get_spec_registry().specs():
        if spec.owner == "models":
            names.update(n.lower() for n in (*spec.names, *spec.loader_aliases, *spec.hf_model_types))
    assert {"qwen3", "qwen2.5", "llama3_hf", "mistral", "gpt2"} <= names
    # the same word meaning something else: transformers' rope_type of Llama 3.x scaling
    elsewhere = {("models/hf_config.py", "llama3")}
    root = os.path.dirname(ascend_patch.__file__)
    files = [os.path.join(root, "models", f) for f in os.listdir(os.path.join(root, "models")) if f.endswith(".py")]
    for folder in ("loaders", "check", "comm", "parallel"):
        files += [os.path.join(root, folder, f) for f in os.listdir(os.path.join(root, folder)) if f.endswith(".py")]
    found = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            where = os.path.relpath(path, root)
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and node.value in names and (where, node.value) not in elsewhere):
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert len(files) > 30 and found == []


def test_what_users_hit_is_the_packages_error_with_a_remedy(tmp_path, capsys):
    """A plugin's incomplete rule, a bad vocabulary divisor, an unknown norm: AscendPatchError with a remedy,
    never a bare NotImplementedError / ValueError / AssertionError (a command prints it; it is no traceback)."""
    import dataclasses
    import json

    from ascend_patch.errors import AscendPatchError
    from ascend_patch.models.args_cli import register
    from ascend_patch.models.vocab import padded_vocab_size
    from ascend_patch.models.weightmap import Rule, RuleIncomplete

    @dataclasses.dataclass(frozen=True)
    class Half(Rule):  # a plugin's rule that forgot shard()
        def hf_shapes(self):
            return {"x": (4,)}

    with pytest.raises(RuleIncomplete) as info:
        Half(mg="decoder.x").shard({"x": "x"}, 2, 0, 0)
    assert isinstance(info.value, AscendPatchError) and isinstance(info.value, NotImplementedError)
    assert str(info.value) == ("weight-map rule Half (decoder.x) does not say how a TP rank's tensor is cut; "
                               "implement shard() in the rule class (see ascend_patch.models.weightmap)")
    with pytest.raises(AscendPatchError) as info:
        padded_vocab_size(300, 0, 1)
    assert info.value.code == "vocab-size" and "must all be positive; fix the size" in str(info.value)
    with pytest.raises(ConfigMismatch) as info:
        importlib.import_module("ascend_patch.models.layer_spec").dense_layer_spec("ScaleNorm")
    assert str(info.value) == "normalization='ScaleNorm' is not supported; use one of LayerNorm, RMSNorm (--normalization)"
    # the command: exit 2 and the message, for a divisor of 0
    (tmp_path / "config.json").write_text(json.dumps({**_TINY, "model_type": "qwen3"}))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    ns = parser.parse_args(["args", "--hf-config", str(tmp_path), "--make-vocab-size-divisible-by", "0"])
    assert ns.func(ns) == 2
    assert capsys.readouterr().err.startswith("ascend-patch args: vocab_size 300, divisor 0 and TP 1 must all be positive")
