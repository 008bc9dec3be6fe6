"""A Hugging Face config with sliding-window attention: kept in the ModelConfig and said, never dropped.

The family specs (llama/mistral, qwen2, qwen3) attend over the whole causal context; the weights do
not depend on the window, so conversion goes on and the note says what differs.
"""

from __future__ import annotations

import warnings

import pytest

from ascend_patch.models.registry import spec_for_hf_config

MISTRAL_V01 = {  # Mistral-7B-v0.1's config.json values
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000, "hidden_act": "silu"}


def _config(**changes):
    raw = dict(MISTRAL_V01, **changes)
    return spec_for_hf_config(raw).config_from_hf(raw)


def test_an_enabled_window_is_kept_and_explained():
    mc = _config()
    assert mc.family == "llama" and mc.sliding_window == 4096
    (note,) = mc.notes
    assert "sliding_window=4096" in note and "'llama' layer spec does not build" in note
    assert "longer than 4096 tokens" in note and "weights are unaffected" in note
    assert mc.megatron_args()["num-layers"] == 32  # the arguments are still produced


@pytest.mark.parametrize("changes", [
    {"sliding_window": None},                              # Mistral v0.2+
    {"sliding_window": 32768},                             # as long as the context: changes nothing
    {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
     "sliding_window": 4096},                              # Qwen2/3 ship it switched off
])
def test_no_window_in_effect_means_no_note(changes):
    mc = _config(**changes)
    assert mc.sliding_window is None and mc.notes == []


def test_transformer_config_warns_with_the_note():
    from ascend_patch.models.transformer_config import transformer_config_kwargs

    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, sliding_window=32)
    with pytest.warns(UserWarning, match=r"sliding_window=32.*whole causal context"):
        kwargs = transformer_config_kwargs(_config(**small))
    assert kwargs["num_layers"] == 2 and "window_size" not in kwargs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transformer_config_kwargs(_config(**dict(small, sliding_window=None)))


def test_the_converter_still_reads_every_weight_and_notes_the_window(tmp_path):
    import torch
    import transformers

    from ascend_patch.loaders.formats import ConvertOptions
    from ascend_patch.loaders.hf import HFLoader

    config = transformers.MistralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                        max_position_embeddings=64, sliding_window=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path)
    source = HFLoader().open(str(tmp_path), ConvertOptions())
    assert source.problems == []
    assert set(source.tensors) == set(source.weight_map.hf_tensors())  # every weight converts
    assert source.config.sliding_window == 16
    assert any("sliding_window=16" in n for n in source.notes)


def test_args_command_prints_the_note_on_stderr(tmp_path, capsys):
    import json

    from ascend_patch.cli import main

    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_V01))
    assert main(["args", "--hf-config", str(tmp_path), "--format", "argv"]) == 0
    out, err = capsys.readouterr()
    assert "--num-layers" in out and "sliding_window" not in out  # stdout stays a usable argument list
    assert err.startswith("note: config.json enables sliding-window attention (sliding_window=4096")
