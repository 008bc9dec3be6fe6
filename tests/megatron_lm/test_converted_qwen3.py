"""A Qwen3 checkpoint converted by ``ascend-patch convert`` (TP2 PP2) finetunes in Megatron-LM's pretrain_gpt.py.

Only the command line and transformers: a tiny random Qwen3 is made from a transformers config,
converted with ``ascend-patch convert``, and launched with the arguments ``ascend-patch args``
prints (the architecture, ``--spec qwen3``, transformers' dropout rates), ``--load ... --finetune
--ckpt-format torch``, the parallel layout and the data: nothing about the model is added by hand,
and Megatron-LM's ``--transformer-impl`` is left at its default.

The tokens are known without re-implementing Megatron's data pipeline: the data set is one
document repeating a random 64-token pattern, so every 65-token training window Megatron cuts from
it (whatever its shuffle picks) is the pattern followed by its first token.

Megatron-LM computes its loss over the padded vocabulary (300 tokens -> 512 rows at TP2), and the
converter writes zero rows there, whose logits are 0: the first-iteration loss must equal the
cross entropy of transformers' logits with 212 zero logits appended (it is log(1 + 212/Z) above
transformers' own loss over 300 tokens, 0.50 nats for this random model; with an unpadded
vocabulary the two are the same). fp32.
"""

from __future__ import annotations

import pytest

from mlm_harness import cli as _cli  # noqa: F401  (_cli, _periodic_data: names test_torch_dist_qwen3.py imports)
from mlm_harness import padded_cross_entropy, run_converted, tiny_hf_model
from mlm_harness import periodic_data as _periodic_data  # noqa: F401

pytestmark = pytest.mark.slow

SEQ, VOCAB, TP, PP = 64, 300, 2, 2
PADDED = 512  # 300 rounded up to a multiple of 128 x TP: what Megatron builds and the converter writes


def _tiny_qwen3(path):
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, max_position_embeddings=128, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return tiny_hf_model(config, transformers.Qwen3ForCausalLM, path)


@pytest.fixture(scope="module")
def qwen3_run(megatron_lm, tmp_path_factory):
    work = tmp_path_factory.mktemp("qwen3")
    model = _tiny_qwen3(work / "hf")
    converted = run_converted(
        megatron_lm, work, model, VOCAB, SEQ, nproc=TP * PP,
        convert=("--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
                 "--target-tensor-parallel-size", str(TP), "--target-pipeline-parallel-size", str(PP)),
        args=("--tensor-model-parallel-size", str(TP)),
        # everything about the model, its layer spec (--spec qwen3) and its dropout (none) comes from args
        launch=("--tensor-model-parallel-size", str(TP), "--pipeline-model-parallel-size", str(PP)))
    return converted.run, converted.model_args, converted.logits, converted.labels


def test_the_printed_args_are_the_converted_model(qwen3_run):
    _, model_args, _, _ = qwen3_run
    for flag in ("--qk-layernorm", "--swiglu", "--disable-bias-linear", "--group-query-attention"):
        assert flag in model_args
    # the launch needs nothing about the model by hand: the family's layer spec and transformers' dropout (none)
    assert model_args[model_args.index("--spec") + 1] == "qwen3"
    assert model_args[model_args.index("--hidden-dropout") + 1] == "0.0"
    assert model_args[model_args.index("--attention-dropout") + 1] == "0.0"
    assert model_args[model_args.index("--kv-channels") + 1] == "24"
    assert model_args[model_args.index("--vocab-size") + 1] == str(VOCAB)


def test_the_first_iteration_loss_is_transformers_on_the_same_tokens(qwen3_run):
    run, _, logits, labels = qwen3_run
    import torch

    expected = padded_cross_entropy(logits, labels, PADDED)
    transformers_loss = torch.nn.functional.cross_entropy(logits, labels).item()
    first = run.record(1)["losses"]["lm loss"]
    assert first == pytest.approx(expected, rel=1e-5), (first, expected, transformers_loss)
    assert first - transformers_loss == pytest.approx(0.504, abs=0.01)  # the 212 zero rows, nothing else
    assert run.record(2)["losses"]["lm loss"] < first  # and it trains
