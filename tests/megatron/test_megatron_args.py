"""Megatron arguments and TransformerConfig from real-shaped HF configs (Qwen3-1.7B's config.json)."""

from __future__ import annotations

import json

import pytest
import torch

from ascend_patch.cli import main

# Qwen3-1.7B's config.json (as published with the model)
QWEN3_1_7B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}

EXPECTED = {
    "num-layers": 28, "hidden-size": 2048, "ffn-hidden-size": 6144, "num-attention-heads": 16,
    "group-query-attention": True, "num-query-groups": 8, "kv-channels": 128,
    "max-position-embeddings": 40960, "position-embedding-type": "rope", "rotary-base": 1000000,
    "normalization": "RMSNorm", "norm-epsilon": 1e-06, "swiglu": True, "disable-bias-linear": True,
    "hidden-dropout": 0.0, "attention-dropout": 0.0,
    "qk-layernorm": True, "vocab-size": 151936, "make-vocab-size-divisible-by": 128, "bf16": True,
}


@pytest.fixture
def qwen3_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1_7B))
    return tmp_path


def test_megatron_args_for_qwen3_1_7b():
    from ascend_patch.models.registry import spec_for_hf_config

    spec = spec_for_hf_config(QWEN3_1_7B)
    mc = spec.config_from_hf(QWEN3_1_7B)
    assert spec.name == "qwen3"
    assert mc.megatron_args() == EXPECTED  # tied: no --untie-embeddings-and-output-weights
    argv = mc.megatron_argv()
    assert "--padded-vocab-size" not in argv  # not a Megatron flag
    assert argv[:4] == ["--num-layers", "28", "--hidden-size", "2048"]
    assert mc.padded_vocab(128, 1) == 151936 and mc.padded_vocab(128, 2) == 152064
    assert mc.padded_vocab(128, 8) == 152576


def test_transformer_config_and_model_kwargs_for_qwen3_1_7b():
    from ascend_patch.models.qwen3.config import config_from_hf
    from ascend_patch.models.transformer_config import gpt_model_kwargs, transformer_config

    mc = config_from_hf(QWEN3_1_7B)
    config = transformer_config(mc, tensor_model_parallel_size=2, sequence_parallel=True)
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (28, 2048, 6144)
    assert (config.num_attention_heads, config.num_query_groups, config.kv_channels) == (16, 8, 128)
    assert config.qk_layernorm and config.gated_linear_unit and config.activation_func is torch.nn.functional.silu
    assert config.normalization == "RMSNorm" and config.layernorm_epsilon == 1e-6
    assert not config.add_bias_linear and not config.add_qkv_bias
    assert config.bf16 and config.params_dtype is torch.bfloat16
    assert (config.hidden_dropout, config.attention_dropout) == (0.0, 0.0)
    assert config.tensor_model_parallel_size == 2 and config.sequence_parallel
    kwargs = gpt_model_kwargs(mc, tensor_parallel_size=2)
    assert kwargs == {"vocab_size": 152064, "max_sequence_length": 40960,
                      "share_embeddings_and_output_weights": True, "position_embedding_type": "rope",
                      "rotary_base": 1000000, "rotary_percent": 1.0, "rope_scaling": False}
    fp32 = transformer_config(mc, dtype="fp32")
    assert not fp32.bf16 and fp32.params_dtype is torch.float32


def test_qwen2_bias_and_llama3_rope_scaling():
    from ascend_patch.models.hf_config import ConfigMismatch
    from ascend_patch.models.llama.config import config_from_hf as llama
    from ascend_patch.models.qwen2.config import config_from_hf as qwen2
    from ascend_patch.models.transformer_config import gpt_model_kwargs, transformer_config_kwargs

    q2 = qwen2({"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
                "num_hidden_layers": 24, "intermediate_size": 4864, "vocab_size": 151936,
                "rope_theta": 1000000.0, "tie_word_embeddings": True})
    assert q2.megatron_args()["add-qkv-bias"] is True
    assert transformer_config_kwargs(q2)["add_qkv_bias"] is True
    base = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
            "num_hidden_layers": 16, "intermediate_size": 8192, "vocab_size": 128256, "rope_theta": 500000.0}
    scaled = llama({**base, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    assert gpt_model_kwargs(scaled)["rope_scaling_factor"] == 32.0
    args = scaled.megatron_args()
    assert args["use-rope-scaling"] is True and args["rope-scaling-factor"] == 32.0
    odd = llama({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                          "original_max_position_embeddings": 4096}})
    with pytest.raises(ConfigMismatch, match="original_max_position_embeddings=4096"):
        gpt_model_kwargs(odd)
    yarn = llama({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ConfigMismatch, match="'yarn'"):
        yarn.megatron_args()


def test_args_command_prints_valid_argv_and_the_vocab(qwen3_dir, capsys):
    assert main(["args", "--hf-config", str(qwen3_dir), "--tensor-model-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "layer spec 'qwen3'" in out
    assert "151936 tokens in config.json; Megatron builds 152064 rows at TP=2" in out
    assert "--padded-vocab-size" not in out
    flags = [line.rstrip(" \\") for line in out.splitlines() if line.startswith("--")]
    assert flags[0] == "--num-layers 28" and "--qk-layernorm" in flags and "--kv-channels 128" in flags
    assert main(["args", "--hf-config", str(qwen3_dir / "config.json"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["args"] == EXPECTED and data["vocab"] == {"true": 151936, "padded": 151936,
                                                          "tensor_parallel_size": 1, "divisible_by": 128}
    assert main(["args", "--hf-config", str(qwen3_dir), "--format", "argv"]) == 0
    argv = capsys.readouterr().out.split()
    assert argv[:2] == ["--num-layers", "28"] and argv[-2:] == ["--spec", "qwen3"]
    # Megatron's default dropout is 0.1; Qwen3 trains with none
    assert argv[argv.index("--hidden-dropout") + 1] == argv[argv.index("--attention-dropout") + 1] == "0.0"
    # what is printed is what --check accepts
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", *argv]) == 0
    assert "agree" in capsys.readouterr().out
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", *argv, "--hidden-dropout", "0.1"]) == 1
    assert "--hidden-dropout 0.1: config.json says 0.0" in capsys.readouterr().out.splitlines()
    assert main(["args", "--hf-config", str(qwen3_dir)]) == 0
    assert "--spec qwen3" in capsys.readouterr().out.splitlines()  # the lines format ends with it too


def test_args_check_flags_each_disagreement(qwen3_dir, capsys):
    good = [f"--{k}" if v is True else f"--{k}={v}" for k, v in EXPECTED.items()]
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", *good]) == 0
    assert "agree" in capsys.readouterr().out
    bad = ["--num-layers", "24", "--hidden-size", "2048", "--swiglu", "--untie-embeddings-and-output-weights",
           "--rotary-base", "10000"]
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", *bad]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "--num-layers 24: config.json says 28" in out
    assert "--rotary-base 10000: config.json says 1000000" in out
    assert "--qk-layernorm is missing: the model needs it" in out
    assert "--untie-embeddings-and-output-weights is given but the model does not use it" in out
    assert not any(line.startswith("--hidden-size") for line in out)


def test_args_command_errors_name_the_problem(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert main(["args", "--hf-config", str(tmp_path)]) == 2
    assert "no model spec serves model_type 'mamba'" in capsys.readouterr().err


def test_multi_valued_flags_and_megatron_spec_form_parse(qwen3_dir, capsys):
    from ascend_patch.models.args_cli import _parse_argv

    argv = ["pretrain_gpt.py", "--num-layers", "28", "--spec", "some.module", "layer_spec", "--data-path", "0.3",
            "a", "0.7", "b", "--swiglu", "--lr=1e-4", "--adam-eps", "-1e-8"]
    assert _parse_argv(argv) == {"num-layers": "28", "spec": ["some.module", "layer_spec"],
                                 "data-path": ["0.3", "a", "0.7", "b"], "swiglu": True, "lr": "1e-4",
                                 "adam-eps": "-1e-8"}
    good = [f"--{k}" if v is True else f"--{k}={v}" for k, v in EXPECTED.items()]
    extra = ["--spec", "some.module", "layer_spec", "--data-path", "a", "b", "c"]
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", *good, *extra]) == 0
    assert main(["args", "--hf-config", str(qwen3_dir), "--check", "--num-layers", "28", "29"]) == 1
    assert "--num-layers 28 29: config.json says 28" in capsys.readouterr().out.splitlines()


def _precision(mc, argv):
    from ascend_patch.models.args_cli import disagreements

    return [str(p) for p in disagreements(mc, argv) if str(p).startswith(("--fp16", "--bf16"))]


def _spec(mc, argv, spec):
    from ascend_patch.models.args_cli import disagreements

    return [str(p) for p in disagreements(mc, argv, spec=spec) if str(p).startswith("--spec")]


def test_half_precision_flag_must_match_the_config_dtype(qwen3_dir):
    from ascend_patch.models.qwen3.config import config_from_hf

    bf16 = config_from_hf(QWEN3_1_7B)
    assert _precision(bf16, ["--fp16"]) == [
        "--fp16: config.json says the model is bfloat16 (torch_dtype/dtype); use --bf16"]
    assert _precision(bf16, ["--bf16"]) == []
    assert _precision(bf16, ["--bf16", "--fp16"]) == ["--fp16 and --bf16 are both given: Megatron takes one; use --bf16"]
    fp16 = config_from_hf({**QWEN3_1_7B, "torch_dtype": "float16"})
    assert _precision(fp16, ["--bf16"]) == [
        "--bf16: config.json says the model is float16 (torch_dtype/dtype); use --fp16"]
    new_style = config_from_hf({**{k: v for k, v in QWEN3_1_7B.items() if k != "torch_dtype"}, "dtype": "float16"})
    assert _precision(new_style, ["--bf16"]) == [
        "--bf16: config.json says the model is float16 (torch_dtype/dtype); use --fp16"]
    fp32 = config_from_hf({**QWEN3_1_7B, "torch_dtype": "float32"})
    assert _precision(fp32, ["--bf16"]) == []  # mixed precision training of an fp32 model is fine


def test_spec_naming_another_family_is_a_disagreement():
    from ascend_patch.models.qwen3.config import config_from_hf

    mc = config_from_hf(QWEN3_1_7B)
    assert _spec(mc, ["--spec", "qwen3"], spec="qwen3") == []
    assert _spec(mc, ["--spec", "qwen2"], spec="qwen3") == [
        "--spec qwen2: config.json describes a qwen3 model; use --spec qwen3"]
    (unknown,) = _spec(mc, ["--spec", "qwen4"], spec="qwen3")
    assert unknown.startswith("--spec qwen4: unknown model spec 'qwen4'; known: ")
    assert _spec(mc, ["--spec", "some.module", "layer_spec"], spec="qwen3") == []


def test_a_null_tokenizer_vocabulary_is_its_flag_plus_the_end_of_document_id_or_the_flag_on_main():
    from ascend_patch.models.args_cli import disagreements
    from ascend_patch.models.qwen3.config import config_from_hf

    mc = config_from_hf(QWEN3_1_7B)
    vocab = QWEN3_1_7B["vocab_size"]

    def vocab_problems(argv):
        return [str(p) for p in disagreements(mc, argv) if str(p).startswith("--vocab-size")]

    # megatron-core up to 0.17: NullTokenizer adds its end-of-document id; Megatron-LM main's counts it
    assert vocab_problems(["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1)]) == []
    assert vocab_problems(["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab)]) == []
    assert vocab_problems(["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 2)]) == [
        f"--vocab-size {vocab - 2}: config.json says {vocab} (give {vocab - 1} with megatron-core up to 0.17, whose "
        f"NullTokenizer adds its end-of-document id, or {vocab} with Megatron-LM main, whose counts it)"]
    assert vocab_problems(["--vocab-size", str(vocab - 1)]) == [f"--vocab-size {vocab - 1}: config.json says {vocab}"]
