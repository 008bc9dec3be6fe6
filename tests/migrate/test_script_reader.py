"""The launch-script reader: what bash would run, read without running it."""

from __future__ import annotations

import pytest

from ascend_patch.migrate.rules import MigrationError
from ascend_patch.migrate.script import from_command, read_script

SCRIPT = r'''#!/bin/bash
export HCCL_CONNECT_TIMEOUT=1800   # a comment after a value
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS=8; NNODES=2
WORLD_SIZE=$(($NPUS*$NNODES))
DATA_PATH="/data/my corpus"   # quoted: one word
TOK='/tok/$NOT_EXPANDED'
GPT_ARGS="
    --num-layers 4 \
    --spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec \
	--seq-length ${SEQ:-64}
"
mkdir -p logs && echo "starting"
# torchrun --this-is-a-comment pretrain_gpt.py
torchrun --nproc_per_node $NPUS --nnodes $NNODES pretrain_gpt.py \
    $GPT_ARGS \
    --data-path "$DATA_PATH" --tokenizer-name-or-path $TOK \
    --world $WORLD_SIZE --empty $UNSET \
    | tee logs/train.log
'''


def test_reads_the_launch_as_bash_would() -> None:
    launch = read_script(SCRIPT)
    assert launch.launcher == ("torchrun", "--nproc_per_node", "8", "--nnodes", "2")
    assert launch.script == "pretrain_gpt.py"
    assert launch.args == ("--num-layers", "4", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
                           "--seq-length", "64", "--data-path", "/data/my corpus", "--tokenizer-name-or-path",
                           "/tok/$NOT_EXPANDED", "--world", "16", "--empty")
    assert dict(launch.env) == {"HCCL_CONNECT_TIMEOUT": "1800", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert launch.pipe == "tee logs/train.log"


def test_an_unquoted_multiword_value_splits_as_in_bash() -> None:
    launch = read_script('P="your data path"\npython pretrain_gpt.py --data-path $P --x "$P"\n')
    assert launch.launcher == ("python",)
    assert launch.args == ("--data-path", "your", "data", "path", "--x", "your data path")


def test_prefix_assignments_and_the_last_training_launch() -> None:
    text = "python convert.py --a 1\nFOO=bar torchrun posttrain_gpt.py --stage sft\npython other.py\n"
    launch = read_script(text)
    assert (launch.script, launch.args, dict(launch.env)) == ("posttrain_gpt.py", ("--stage", "sft"), {"FOO": "bar"})


def test_what_it_cannot_read_says_so() -> None:
    with pytest.raises(MigrationError, match="no training launch"):
        read_script("echo hello\n")
    with pytest.raises(MigrationError, match="command substitution"):
        read_script("X=$(hostname)\ntorchrun pretrain_gpt.py --a $X\n")
    with pytest.raises(MigrationError, match=r"only integer \+ - \* / %"):
        read_script("X=$((2**3))\ntorchrun pretrain_gpt.py\n")


def test_a_command_line_given_as_words() -> None:
    assert from_command(["torchrun", "--nproc_per_node", "2", "pretrain_gpt.py", "--bf16"]).args == ("--bf16",)
    assert from_command(["pretrain_gpt.py", "--bf16"]).launcher == ("torchrun",)
    assert from_command(["--bf16"]).script == "pretrain_gpt.py"
