"""``ascend-patch migrate``: the script it prints, its JSON, its exit status; and the rule table in the docs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from helpers import REPO
from msl_scripts import examples_dir, filled

from ascend_patch.cli import main
from ascend_patch.migrate.releases import rules
from ascend_patch.migrate.report import markdown_table, table_in


@pytest.fixture(scope="module")
def mcore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return examples_dir(tmp_path_factory.mktemp("msl"))


def test_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["migrate", "--format", "json", "--megatron-release", "0.16.1", "--", "torchrun", "--nproc_per_node",
                 "2", "pretrain_gpt.py", "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", "/tok",
                 "--use-fused-rmsnorm", "--reuse-fp32-param", "--num-layers", "2"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["command"] == ["torchrun", "--nproc_per_node", "2", "-m", "ascend_patch", "pretrain_gpt.py",
                              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok", "--num-layers",
                              "2", "--tokenizer-hf-use-fast"]
    assert [(f["flag"], f["value"], f["action"], f["to"]) for f in doc["flags"]] == [
        ("pretrain_gpt.py", None, "kept", ["pretrain_gpt.py"]),
        ("--tokenizer-type", "PretrainedFromHF", "translated", ["--tokenizer-type", "HuggingFaceTokenizer"]),
        ("--tokenizer-name-or-path", "/tok", "translated", ["--tokenizer-model", "/tok"]),
        ("--use-fused-rmsnorm", None, "implied", []),
        ("--reuse-fp32-param", None, "dropped", []),
        ("--num-layers", "2", "kept", ["--num-layers", "2"]),
        ("--tokenizer-not-use-fast", None, "made explicit", ["--tokenizer-hf-use-fast"]),
    ]
    assert all(set(f) == {"flag", "value", "action", "to", "why"} and f["why"] for f in doc["flags"])
    assert "memory" in doc["flags"][4]["why"]


def test_a_refused_script_prints_the_script_and_exits_1(mcore: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = mcore / "qwen3" / "tune_qwen3_0point6b_4K_full_ptd.sh"
    assert main(["migrate", str(script), "--megatron-release", "0.16.1"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash") and "# REFUSED" in captured.out
    assert "posttrain_gpt.py: MindSpeed-LLM post-training" in captured.err


def test_the_printed_script_is_bash_that_runs_the_translated_command(mcore: Path, tmp_path: Path) -> None:
    text = filled((mcore / "qwen3" / "pretrain_qwen3_4b_4K_ptd.sh").read_text(), TOKENIZER_PATH="/tok dir",
                  DATA_PATH="/data", CKPT_LOAD_DIR="/in", CKPT_SAVE_DIR="/out")
    (tmp_path / "in.sh").write_text(text)
    out = subprocess.run([os.path.join(os.path.dirname(__import__("sys").executable), "ascend-patch"), "migrate",
                          str(tmp_path / "in.sh"), "--megatron-release", "0.16.1", "--format", "json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    command = json.loads(out.stdout)["command"]
    script = subprocess.run([os.path.join(os.path.dirname(__import__("sys").executable), "ascend-patch"), "migrate",
                             str(tmp_path / "in.sh"), "--megatron-release", "0.16.1"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": REPO}).stdout
    # run the printed script with torchrun stubbed out: it must receive exactly the JSON command
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").write_text('#!/bin/bash\nfor a in "$@"; do echo "$a"; done > "$ARGS_OUT"\n')
    (tmp_path / "bin" / "torchrun").chmod(0o755)
    (tmp_path / "logs").mkdir()
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "ARGS_OUT": str(tmp_path / "argv")})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "argv").read_text().splitlines() == command[1:]
    assert "--tokenizer-model" in command and command[command.index("--tokenizer-model") + 1] == "/tok dir"
    assert shlex.quote("/tok dir") in script


def test_docs_table_is_generated_from_the_data() -> None:
    doc = os.path.join(REPO, "docs", "migrating.md")
    assert table_in(doc) == markdown_table(rules()), (
        "docs/migrating.md's MindSpeed-LLM table is stale: ascend-patch migrate --markdown --update docs/migrating.md")
