"""The in-process translation (plugin ``migrate``), the hook for third-party rules, and the patch it declares."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from ascend_patch.hookspec import hookimpl
from ascend_patch.migrate import inprocess
from ascend_patch.migrate.plugin import migrate_patches
from ascend_patch.migrate.releases import rules
from ascend_patch.migrate.rules import Action, FlagRule, MigrationRefused
from ascend_patch.migrate.table import FLAGS
from ascend_patch.migrate.translate import StockParser, translate
from ascend_patch.patch import Wrap
from ascend_patch.plugins import PluginManager, reset_plugin_manager

STOCK = StockParser(frozenset({"--num-layers", "--tokenizer-type", "--tokenizer-model", "--spec", "--bf16",
                               "--use-flash-attn", "--tokenizer-hf-use-fast", "--load",
                               "--deterministic-mode"}),
                    {"--tokenizer-type": frozenset({"HuggingFaceTokenizer", "NullTokenizer"})})


@pytest.fixture
def argv_and_stock(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(inprocess, "stock_parser", lambda extra=None: STOCK)
    monkeypatch.setattr(inprocess, "_announced", set())
    seen: list[list[str]] = []

    def parse(extra_args_provider: Any = None, ignore_unknown_args: bool = False) -> list[str]:
        seen.append(list(sys.argv))
        return list(sys.argv)

    def call(argv: list[str]) -> list[str]:
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
        result = inprocess.parse_args(parse, None, (), {})
        assert sys.argv == ["pretrain_gpt.py", *argv]  # the user's argv is back afterwards
        return result[1:]

    return call, seen


def test_a_stock_command_line_is_left_alone(argv_and_stock: Any, capsys: pytest.CaptureFixture[str]) -> None:
    call, _ = argv_and_stock
    assert call(["--num-layers", "2", "--use-flash-attn", "--tokenizer-type", "NullTokenizer"]) == \
        ["--num-layers", "2", "--use-flash-attn", "--tokenizer-type", "NullTokenizer"]
    assert capsys.readouterr().out == ""


def test_a_mindspeed_llm_command_line_is_translated_and_announced_once(argv_and_stock: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    call, _ = argv_and_stock
    argv = ["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", "/tok", "--use-flash-attn"]
    expected = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok", "--tokenizer-hf-use-fast"]
    assert call(argv) == expected
    assert call(argv) == expected
    out = capsys.readouterr().out
    assert out.count("ascend_patch migrate: MindSpeed-LLM flags") == 1
    assert "  --tokenizer-name-or-path /tok: translated -> --tokenizer-model /tok" in out
    assert "  --use-flash-attn: dropped" in out


def test_a_value_only_mindspeed_llm_knows_engages_it(argv_and_stock: Any) -> None:
    call, _ = argv_and_stock
    assert call(["--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec", "--bf16"]) == \
        ["--qk-layernorm", "--bf16"]


def test_refused_flags_stop_with_migrates_message(argv_and_stock: Any) -> None:
    call, seen = argv_and_stock
    argv = ["--stage", "sft", "--is-instruction-dataset", "--seq-aux"]
    with pytest.raises(MigrationRefused) as caught:
        call(argv)
    assert not seen  # stock's parse_args never ran
    expected = translate(argv, "0.16.1", "26.1.0", FLAGS, script="pretrain_gpt.py", stock=STOCK).refusal()
    assert str(caught.value) == expected
    assert "--seq-aux" in expected and "--stage sft" in expected


def test_the_patch_it_declares() -> None:
    (patch,) = migrate_patches(backend=None)
    assert isinstance(patch, Wrap) and patch.target == "megatron.training.arguments:parse_args"
    assert patch.wrapper is inprocess.parse_args
    from ascend_patch.adaptors.megatron.releases import needed_on

    # needed on every release, as Megatron-LM's other release-independent patches
    assert (patch.package, patch.versions, patch.needed) == (None, None, None) and needed_on() == {}


class _Plugin:
    @hookimpl
    def ascend_patch_migrate_flags(self) -> list[FlagRule]:
        return [FlagRule("--seq-aux", Action.DROPPED, "a third-party rule"),
                FlagRule("--reuse-fp32-param", Action.REFUSED, "this site refuses it", megatron=">=0.16")]


def test_a_plugin_adds_and_overrides_rules() -> None:
    manager = PluginManager(entry_points=False)
    manager.register(_Plugin(), "site_rules", origin="test")
    previous = reset_plugin_manager(manager)
    try:
        table = rules()
    finally:
        reset_plugin_manager(previous)
    assert table[:2] == _Plugin().ascend_patch_migrate_flags() and table[2:] == list(FLAGS)
    migration = translate(["--seq-aux", "--reuse-fp32-param"], "0.16.1", "26.1.0", table)
    assert [(r.flag, r.action) for r in migration.rows] == [("--seq-aux", Action.DROPPED),
                                                            ("--reuse-fp32-param", Action.REFUSED)]
    older = translate(["--reuse-fp32-param"], "0.12.1", "26.1.0", table)
    assert older.rows[0].action is Action.DROPPED  # the plugin's rule is for >=0.16 only: the built-in one applies


def test_a_launch_that_needs_its_conversion_first_says_which(argv_and_stock: Any, tmp_path: Any) -> None:
    call, seen = argv_and_stock
    argv = ["--enable-hf2mg-convert", "--model-type-hf", "qwen3", "--load", str(tmp_path / "hf")]
    with pytest.raises(MigrationRefused, match=r"needs a step before it") as caught:
        call(argv)
    assert not seen
    unknown_load = translate(argv, "0.16.1", "26.1.0", FLAGS, stock=StockParser(frozenset()))
    assert "--load" not in [r.flag for r in unknown_load.refused]  # replaced by the translation, not unknown
    assert (f"ascend-patch convert --load-model-type hf --save-model-type mg --model-type-hf qwen3 "
            f"--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1 --load-dir {tmp_path}/hf "
            f"--save-dir {tmp_path}/hf_megatron_cache_tp1pp1ep1") in str(caught.value)


def test_translations_are_listed_in_the_report(argv_and_stock: Any) -> None:
    from ascend_patch import usage

    call, _ = argv_and_stock
    recorder = usage.UsageRecorder()
    usage.set_recorder(recorder)
    try:
        call(["--tokenizer-name-or-path", "/tok", "--reuse-fp32-param", "--num-layers", "2"])
    finally:
        usage.set_recorder(None)
    assert {(u.api, u.action) for u in recorder.uses()} == {
        ("MindSpeed-LLM --tokenizer-name-or-path", "translated"), ("MindSpeed-LLM --reuse-fp32-param", "dropped")}


def test_a_variable_a_translation_needs_is_set(argv_and_stock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    call, _ = argv_and_stock
    monkeypatch.setenv("NCCL_ALGO", "unset")  # recorded, so the variable is put back afterwards
    monkeypatch.delenv("NCCL_ALGO")
    assert call(["--npu-deterministic", "--num-layers", "2"]) == ["--deterministic-mode", "--num-layers", "2"]
    assert os.environ["NCCL_ALGO"] == "Ring"
