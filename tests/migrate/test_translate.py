"""The translator and the table: each action, the per-release rows, and every vendored script accounted for."""

from __future__ import annotations

from pathlib import Path

import pytest

from msl_scripts import examples_dir, pretrain_scripts, tune_scripts

from ascend_patch.migrate import migrate_launch
from ascend_patch.migrate.rules import Action, MigrationRefused
from ascend_patch.migrate.script import from_command, read_script
from ascend_patch.migrate.table import FLAGS
from ascend_patch.migrate.translate import StockParser, parse_flags, translate


def run(argv: str, megatron: str = "0.16.1", msl: str = "26.1.0", **kw):
    return translate(argv.split(), megatron, msl, FLAGS, **kw)


def row(migration, flag: str):
    found = [r for r in migration.rows if r.flag == flag]
    assert len(found) == 1, (flag, migration.rows)
    return found[0]


@pytest.fixture(scope="module")
def mcore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return examples_dir(tmp_path_factory.mktemp("msl"))


@pytest.mark.parametrize("kind", ["pretrain", "tune"])
def test_every_flag_of_every_vendored_script_has_one_row(mcore: Path, kind: str) -> None:
    scripts = pretrain_scripts(mcore) if kind == "pretrain" else tune_scripts(mcore)
    assert len(scripts) == (12 if kind == "pretrain" else 24)
    for script in scripts:
        launch = read_script(script.read_text())
        for release in ("0.12.1", "0.16.1"):
            migration = migrate_launch(launch, megatron=release)
            given = parse_flags(launch.args)
            flag_rows = [r for r in migration.rows if r.flag.startswith("--") and r.value is not None or
                         r.flag in {g.flag for g in given}]
            assert [r.flag for r in migration.rows[1:1 + len(given)]] == [g.flag for g in given], script.name
            assert migration.rows[0].flag == launch.script
            assert [r.flag for r in migration.rows[-len(launch.env):]] == list(launch.env)
            assert len(flag_rows) >= len(given)
            if kind == "tune":
                assert migration.rows[0].action is Action.REFUSED and "packed instruction" in migration.rows[0].why
                with pytest.raises(MigrationRefused, match="posttrain_gpt.py"):
                    migration.raise_if_refused()


def test_release_differences_come_from_the_table() -> None:
    argv = ("--tokenizer-type PretrainedFromHF --tokenizer-name-or-path /tok --padded-vocab-size 151936 "
            "--make-vocab-size-divisible-by 1 --tensor-model-parallel-size 8 --moe-token-dispatcher-type alltoall_seq")
    old, new = run(argv, "0.12.1"), run(argv, "0.16.1")
    assert old.args == ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok",
                        "--make-vocab-size-divisible-by", "18992", "--tensor-model-parallel-size", "8",
                        "--moe-token-dispatcher-type", "alltoall_seq")
    assert row(old, "--make-vocab-size-divisible-by").action is Action.TRANSLATED
    assert new.args == ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok",
                        "--padded-vocab-size", "151936", "--make-vocab-size-divisible-by", "1",
                        "--tensor-model-parallel-size", "8", "--moe-token-dispatcher-type", "alltoall",
                        "--tokenizer-hf-use-fast")
    assert row(new, "--tokenizer-not-use-fast").action is Action.EXPLICIT
    slow = "--tokenizer-type PretrainedFromHF --tokenizer-not-use-fast"
    assert run(slow, "0.12.1").args == ("--tokenizer-type", "HuggingFaceTokenizer")
    assert row(run(slow, "0.12.1"), "--tokenizer-not-use-fast").action is Action.DROPPED
    assert run(slow, "0.16.1").args == ("--tokenizer-type", "HuggingFaceTokenizer")
    assert run(slow, "0.17.1").args == ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-hf-no-use-fast")
    assert [r.flag for r in run(argv.replace("size 8", "size 7"), "0.12.1").refused] == ["--padded-vocab-size"]


def test_noop_layers_become_a_layout_or_an_uneven_first_stage() -> None:
    big = "--num-layers 96 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 8 --noop-layers 94,95"
    new = run(big)
    assert new.args == ("--pipeline-model-parallel-size", "4", "--num-layers", "94", "--pipeline-model-parallel-layout",
                        "Et*8|" + "t*8|" * 10 + "t*6L")
    assert row(new, "--num-layers-per-virtual-pipeline-stage").action is Action.TRANSLATED
    assert [r.flag for r in run(big, "0.12.1").refused] == ["--noop-layers"]
    first = run("--num-layers 32 --pipeline-model-parallel-size 4 --noop-layers 0", "0.12.1")
    assert first.args == ("--pipeline-model-parallel-size", "4", "--num-layers", "31",
                          "--decoder-first-pipeline-num-layers", "7")
    last = run("--num-layers 16 --pipeline-model-parallel-size 2 --noop-layers 15", "0.12.1")
    assert last.args == ("--pipeline-model-parallel-size", "2", "--num-layers", "15",
                         "--decoder-first-pipeline-num-layers", "8")
    listed = run("--num-layers 8 --pipeline-model-parallel-size 2 --num-layer-list 3,5")
    assert listed.args[-2:] == ("--pipeline-model-parallel-layout", "Et*3|t*5L")


def test_moe_rules() -> None:
    dense = run("--num-layers 8 --num-experts 4 --first-k-dense-replace 3")
    assert dense.args == ("--num-layers", "8", "--num-experts", "4", "--moe-layer-freq", "([0]*3+[1]*5)")
    every_other = run("--num-layers 6 --moe-layer-freq 2 --first-k-dense-replace 1")
    assert every_other.args == ("--num-layers", "6", "--moe-layer-freq", "[0,0,1,0,1,0]")
    assert run("--first-k-dense-replace -1").args == ()
    assert row(run("--norm-topk-prob"), "--norm-topk-prob").action is Action.IMPLIED
    assert [r.flag for r in run("--norm-topk-prob --moe-router-pre-softmax").refused] == ["--norm-topk-prob"]
    overlap = "--moe-alltoall-overlap-comm --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall --bf16"
    assert "--overlap-moe-expert-parallel-comm" in run(overlap).args
    recompute = run(overlap + " --recompute-granularity full")
    assert row(recompute, "--moe-alltoall-overlap-comm").action is Action.DROPPED
    assert "no recomputation" in row(recompute, "--moe-alltoall-overlap-comm").why
    assert row(run(overlap, "0.12.1"), "--moe-alltoall-overlap-comm").action is Action.DROPPED


def test_value_rules_rope_cp_spec_and_determinism() -> None:
    rope = "--rope-scaling-type llama3 --low-freq-factor 1 --high-freq-factor 4 --original-max-position-embeddings 8192"
    assert run(rope).args == ("--use-rope-scaling",)
    assert [r.flag for r in run(rope.replace("--low-freq-factor 1", "--low-freq-factor 2")).refused] == \
        ["--rope-scaling-type", "--low-freq-factor"]
    assert [r.flag for r in run("--rope-scaling-type yarn").refused] == ["--rope-scaling-type"]
    hybrid = run("--context-parallel-size 4 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 2")
    assert hybrid.args == ("--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                           "--hierarchical-context-parallel-sizes", "2", "2")
    assert run("--context-parallel-algo hybrid_cp_algo").refused
    assert run("--context-parallel-algo kvallgather_cp_algo").args == ("--cp-comm-type", "all_gather")
    assert run("--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec").args == ("--qk-layernorm",)
    assert run("--qk-layernorm --spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec").args == ("--qk-layernorm",)
    assert run("--spec mindspeed_llm.tasks.models.spec.deepseek3_spec layer_spec").refused
    assert run("--spec megatron.core.models.gpt.gpt_layer_specs get_gpt_layer_local_spec").args[0] == "--spec"
    deterministic = run("--npu-deterministic")
    assert deterministic.args == ("--deterministic-mode",) and deterministic.env == {"NCCL_ALGO": "Ring"}
    gloo = "--disable-gloo-group --use-distributed-optimizer"
    assert row(run(gloo + " --ckpt-format torch"), "--disable-gloo-group").action is Action.DROPPED
    assert "--disable-gloo-process-groups" in run(gloo + " --ckpt-format torch_dist").args


def test_mindspeed_llm_2_3_defaults_are_made_explicit() -> None:
    old = run("--num-layers 2", msl="2.3.0")
    assert old.args == ("--num-layers", "2", "--transformer-impl", "local", "--ckpt-format", "torch")
    assert {r.flag for r in old.rows if r.action is Action.EXPLICIT} == {"--transformer-impl", "--ckpt-format"}
    assert run("--transformer-impl transformer_engine", msl="2.3.0").args[:2] == ("--transformer-impl", "local")
    assert run("--num-layers 2", msl="26.1.0").args == ("--num-layers", "2")


def test_unknown_flags_pass_unless_stock_is_known(tmp_path: Path) -> None:
    assert row(run("--seq-aux"), "--seq-aux").action is Action.KEPT
    stock = StockParser(frozenset({"--num-layers"}))
    refused = run("--seq-aux --num-layers 2", stock=stock)
    assert [r.flag for r in refused.refused] == ["--seq-aux"] and "ascend_patch_migrate_flags" in refused.refusal()


def test_environment_rows(tmp_path: Path) -> None:
    migration = run("--bf16", env={"HCCL_CONNECT_TIMEOUT": "1800", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "MY_VAR": "x"})
    assert {r.flag: r.action for r in migration.rows[-3:]} == {
        "HCCL_CONNECT_TIMEOUT": Action.KEPT, "CUDA_DEVICE_MAX_CONNECTIONS": Action.DROPPED, "MY_VAR": Action.KEPT}
    assert migration.env == {"HCCL_CONNECT_TIMEOUT": "1800", "MY_VAR": "x"}


def test_hf2mg_convert_becomes_a_convert_step(tmp_path: Path) -> None:
    argv = f"--enable-hf2mg-convert --model-type-hf qwen3-moe --load {tmp_path}/hf --pipeline-model-parallel-size 2"
    migration = run(argv)
    ours = f"{tmp_path}/hf_megatron_cache_tp1pp2ep1"
    assert migration.args == ("--load", ours, "--pipeline-model-parallel-size", "2")
    assert migration.before == (f"ascend-patch convert --load-model-type hf --save-model-type mg --model-type-hf "
                                f"qwen3-moe --target-tensor-parallel-size 1 --target-pipeline-parallel-size 2 "
                                f"--load-dir {tmp_path}/hf --save-dir {ours}",)
    theirs = tmp_path / "hf" / "megatron_cache_tp1pp2ep1"
    theirs.mkdir(parents=True)
    (theirs / "latest_checkpointed_iteration.txt").write_text("1")
    done = run(argv)
    assert done.before == () and done.args[:2] == ("--load", str(theirs))
    assert row(run("--model-type-hf qwen3"), "--model-type-hf").action is Action.DROPPED


def test_a_migrated_command_keeps_its_launcher() -> None:
    from ascend_patch.migrate.report import command

    launch = from_command(["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "pretrain_gpt.py",
                           "--use-fused-swiglu", "--bf16"])
    migration = migrate_launch(launch, megatron="0.16.1")
    assert command(launch, migration) == ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                                          "ascend_patch", "pretrain_gpt.py", "--bf16"]


def test_the_dense_qwen3_spec_with_flash_attention_keeps_fused_attention() -> None:
    """Every vendored script asks for MindSpeed-LLM's qwen3 spec and --use-flash-attn: the dense ones become
    --spec qwen3 (the same state-dict names, npu_fusion_attention), not the local spec's unfused attention, which
    keeps each layer's S x S probabilities (check --memory: 191 GiB against 74 GiB on the first stage of their
    Qwen3-8B script); MoE launches keep the local spec (their experts) and say what dropping the flag costs."""
    spec = "--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec"
    dense = run(spec + " --use-flash-attn")
    assert dense.args == ("--spec", "qwen3", "--qk-layernorm")  # as ascend-patch args writes a qwen3 launch
    assert row(dense, "--use-flash-attn").action is Action.IMPLIED
    assert row(dense, "--spec").action is Action.TRANSLATED
    moe = run(spec + " --use-flash-attn --num-experts 8")
    assert moe.args == ("--qk-layernorm", "--num-experts", "8")
    flash = row(moe, "--use-flash-attn")
    assert flash.action is Action.DROPPED and "S x S" in flash.why and "check --memory" in flash.why
    assert row(run("--use-flash-attn"), "--use-flash-attn").action is Action.DROPPED  # the local spec, no family
