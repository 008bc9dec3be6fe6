"""A checkpoint in MindSpeed-LLM's converter layout, read by ``ascend-patch convert`` (loader ``mindspeed_llm``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from msl_checkpoint import write_msl_checkpoint

from ascend_patch.cli import main
from ascend_patch.migrate.checkpoint import is_mindspeed_llm_args, megatron_args


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    work = tmp_path_factory.mktemp("msl-ckpt")
    config = transformers.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, tie_word_embeddings=False, rope_theta=1e6)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(work / "hf")
    write_msl_checkpoint(work / "hf", work / "msl")
    return work


def test_the_packed_args_read_as_megatron_names() -> None:
    packed = argparse.Namespace(model_type_hf="qwen3", num_attention_heads=32, num_key_value_heads=8,
                                group_query_attention=False, intermediate_size=12288, use_rotary_position_embeddings=True,
                                torch_dtype="bfloat16", hidden_size=4096, num_layers=36)
    assert is_mindspeed_llm_args(packed) and not is_mindspeed_llm_args(argparse.Namespace(num_layers=2))
    named = megatron_args(packed)
    assert (named.num_query_groups, named.group_query_attention, named.ffn_hidden_size, named.position_embedding_type,
            named.params_dtype) == (8, True, 12288, "rope", "bfloat16")


def test_convert_reads_it_back_to_the_hf_weights_bit_for_bit(checkpoint: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    assert main(["convert", "--load-model-type", "mindspeed_llm", "--save-model-type", "hf", "--load-dir",
                 str(checkpoint / "msl"), "--save-dir", str(checkpoint / "back"), "--no-progress"]) == 0
    assert "mindspeed_llm checkpoint of a qwen3 model (TP 1, PP 1, local naming)" in capsys.readouterr().out
    original = {k: v for f in (checkpoint / "hf").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    back = {k: v for f in (checkpoint / "back").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    assert back.keys() == original.keys()
    assert all(bool((back[k] == original[k]).all()) for k in original)


def test_the_legacy_loader_alone_misreads_it(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf", "qwen3",
                 "--load-dir", str(checkpoint / "msl"), "--save-dir", str(checkpoint / "wrong"), "--no-progress"])
    assert code != 0 and "wrong shape" in capsys.readouterr().err
