"""``check`` judges the launch a Megatron command line describes, and the converter's KV-head rule (issue 13 item 12)."""

from __future__ import annotations

import json

from ascend_patch.cli import main

RULE = ("2 query groups (KV heads) do not fit 4 tensor-parallel ranks: ascend-patch convert writes each rank's own KV "
        "heads and cannot replicate them, so TP must divide the query groups")


def run(capsys, *argv):
    code = main(["check", *map(str, argv)])
    return code, capsys.readouterr().out


def test_parallel_sizes_in_megatron_args_are_the_launch(capsys):
    # TP3 x PP8 on 8 ranks with 8 heads and 28 layers passed as TP1 PP1
    code, out = run(capsys, "--world-size", 8, "--megatron-args",
                    "pretrain_gpt.py --tensor-model-parallel-size 3 --pipeline-model-parallel-size 8 --num-layers 28 "
                    "--num-attention-heads 8 --hidden-size 512")
    assert code == 1, out
    assert "world size 8 is not divisible by TP x PP x CP = 3 x 8 x 1 = 24" in out
    assert "8 attention heads cannot be split over 3 tensor-parallel ranks" in out
    assert "28 layers cannot be split over 8 pipeline stages" in out
    assert "model (--megatron-args): num layers 28, num attention heads 8, hidden size 512" in out
    code, out = run(capsys, "--world-size", 8, "--megatron-args", "--tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 4 --num-layers 28 --num-attention-heads 8")
    assert code == 0 and "TP=2 x CP=1 x DP=1 x PP=4 = 8 ranks" in out, out


def test_a_size_given_twice_with_two_values_is_an_error(capsys):
    code, out = run(capsys, "--world-size", 8, "--tp", 2, "--megatron-args",
                    "--tensor-model-parallel-size 4 --context-parallel-size 2 --seq-length 4097 --sequence-parallel")
    assert code == 1
    assert ("--tensor-model-parallel-size 2 contradicts --megatron-args, which says --tensor-model-parallel-size 4; "
            "give each size once: the job runs with what its command line says") in out
    # CP and the sequence length came from the command line too (TP=2 from check's own flag)
    assert "sequence length 4097 cannot be split into 2 x CP = 4 chunks (CP=2)" in out
    code, out = run(capsys, "--world-size", 8, "--tp", 4, "--megatron-args", "--tensor-model-parallel-size 4")
    assert code == 0, out


def test_kv_heads_vs_tp_is_one_rule_with_one_message_in_check_and_convert(tmp_path, capsys):
    # check said OK for 2 KV heads at TP4 with an HF config, then convert refused it
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = str(tmp_path / "hf")
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2,
                                 num_hidden_layers=2, vocab_size=256)).save_pretrained(hf)
    code, out = run(capsys, "--world-size", 4, "--tp", 4, "--hf-config", hf)
    assert code == 1 and f"{RULE}; use --tensor-model-parallel-size 1 or 2" in out
    assert main(["convert", "--load-dir", hf, "--save-dir", str(tmp_path / "mg"),
                 "--target-tensor-parallel-size", "4", "--no-progress"]) == 2
    assert f"{RULE}; use --target-tensor-parallel-size 1 or 2" in capsys.readouterr().err
    # sizes alone (training from scratch): megatron-core replicates the KV heads; the converter's rule is a warning
    code, out = run(capsys, "--world-size", 4, "--tp", 4, "--num-attention-heads", 8, "--num-query-groups", 2)
    assert code == 0
    assert (f"warnings (1):\n  - {RULE}; use --tensor-model-parallel-size 1 or 2 to convert checkpoints for it "
            "(megatron-core itself runs this TP)") in out


def test_kv_rule_applies_to_the_reshard_check_prints(tmp_path, capsys):
    from test_check_command import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "c", tp=2, args={"num_attention_heads": 8, "num_query_groups": 2})
    code, out = run(capsys, "--world-size", 4, "--tp", 4, "--load", ckpt)
    assert code == 1 and "this checkpoint was saved with TP=2 but you are launching TP=4" in out
    assert f"{RULE}; use --tensor-model-parallel-size 1 or 2" in out
    code, out = run(capsys, "--world-size", 2, "--tp", 2, "--load", ckpt)
    assert code == 0, out


def test_json_shows_the_launch_from_megatron_args(capsys):
    code, out = run(capsys, "--world-size", 4, "--json", "--megatron-args", "--pipeline-model-parallel-size 2")
    assert code == 0 and json.loads(out)["layout"]["pp"] == 2
