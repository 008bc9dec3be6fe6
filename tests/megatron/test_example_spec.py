"""examples/pretrain_gpt.py's --spec handling: a registered name, and Megatron's 'module attribute'
form as two words or as one quoted argument (a fast in-process check, no torchrun)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from mcore_run import EXAMPLE


@pytest.fixture
def example(monkeypatch, tmp_path):
    """The example imported as a module (it puts examples/ on sys.path: restored afterwards), and a
    throw-away spec module on sys.path."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    (tmp_path / "my_layer_specs.py").write_text(
        "from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec\n"
        "SPEC = get_gpt_layer_local_spec(normalization='LayerNorm')\n"
        "def build(config):\n"
        "    build.seen = config\n"
        "    return get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization='LayerNorm')\n")
    sys.path.insert(0, str(tmp_path))
    spec = importlib.util.spec_from_file_location("pretrain_gpt_under_test", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        for name in set(sys.modules) - before:
            if name in ("my_layer_specs", "gpt_data", "gpt_checkpoint"):
                del sys.modules[name]


@pytest.mark.parametrize("argv", [["--spec", "my_layer_specs SPEC"], ["--spec", "my_layer_specs", "SPEC"]])
def test_megatron_form_with_a_module_spec(example, argv):
    import my_layer_specs

    args = example.parse_args(argv)
    assert example.layer_spec(args, types.SimpleNamespace(qk_layernorm=False)) is my_layer_specs.SPEC


@pytest.mark.parametrize("argv", [["--spec", "my_layer_specs build"], ["--spec", "my_layer_specs", "build"]])
def test_megatron_form_with_a_function_of_the_config(example, argv):
    import my_layer_specs
    from megatron.core.transformer.identity_op import IdentityOp

    config = types.SimpleNamespace(qk_layernorm=True)
    spec = example.layer_spec(example.parse_args(argv), config)
    assert my_layer_specs.build.seen is config
    assert spec.submodules.self_attention.submodules.q_layernorm is not IdentityOp


def test_registered_name_and_bad_forms(example):
    from ascend_patch.models.attention import ContextParallelAttention

    config = types.SimpleNamespace(normalization="RMSNorm", qk_layernorm=False)
    spec = example.layer_spec(example.parse_args(["--spec", "qwen3"]), config)
    assert spec.submodules.self_attention.submodules.core_attention is ContextParallelAttention
    with pytest.raises(SystemExit, match="--spec takes a registered name or 'module attribute'"):
        example.layer_spec(example.parse_args(["--spec", "a", "b", "c"]), config)
