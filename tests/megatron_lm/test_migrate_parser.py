"""Every vendored MindSpeed-LLM pretrain script, translated, is accepted by stock Megatron-LM's own parser.

For each release, one child process imports that Megatron-LM snapshot (0.12.1 with its own
megatron/core first on the path; 0.16.1 with the installed wheel) and calls its
``megatron.training.arguments.parse_args`` on every translated command line, with the migrate
plugin disabled, so the parser is stock's. The parsed values show the translations arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, child_env
from mlm_harness import find_tarball, unpack
from msl_scripts import examples_dir, filled, pretrain_scripts, vendor_file

from ascend_patch.migrate import migrate_launch
from ascend_patch.migrate.rules import Action
from ascend_patch.migrate.script import read_script

PATHS = {"TOKENIZER_PATH": "/models/Qwen3", "DATA_PATH": "/data/qwen_text_document",
         "CKPT_LOAD_DIR": "/ckpt/in", "CKPT_SAVE_DIR": "/ckpt/out"}
REFUSED_AT = {("0.12.1", "pretrain_qwen3_235b_a22b_4k_A3_ptd.sh"): ["--noop-layers"],
              ("0.12.1", "pretrain_qwen3_480b_4k_A3_ptd.sh"): ["--noop-layers"]}


@pytest.fixture(scope="module")
def mcore(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return examples_dir(tmp_path_factory.mktemp("msl"))


def _snapshot(release: str, into: Path) -> Path:
    if release == "0.16.1":
        return unpack(find_tarball(), into)
    return unpack(vendor_file(f"megatron-lm-core_v{release}.tar.gz"), into)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["0.12.1", "0.16.1"])
def test_stock_parser_accepts_every_translated_pretrain_script(release: str, mcore: Path, tmp_path: Path) -> None:
    scripts = pretrain_scripts(mcore)
    assert len(scripts) == 12
    jobs, migrations = [], {}
    for script in scripts:
        launch = read_script(filled(script.read_text(), **PATHS))
        migration = migrate_launch(launch, megatron=release)
        migrations[script.name] = (launch, migration)
        assert [r.flag for r in migration.refused] == REFUSED_AT.get((release, script.name), []), script.name
        jobs.append({"name": script.name, "args": list(migration.args)})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    root = _snapshot(release, tmp_path / "mlm")
    env = child_env(ASCEND_PATCH_DEVICE="cpu", ASCEND_PATCH_DISABLE_PLUGINS="migrate", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(root), REPO])
    done = subprocess.run([sys.executable, "-m", "ascend_patch", os.path.join(REPO, "tests", "megatron_lm",
                           "migrate_parse_worker.py"), str(tmp_path / "jobs.json"), str(tmp_path / "out.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["release"] == release
    for name, (launch, migration) in migrations.items():
        parsed = out["jobs"][name]
        assert parsed["ok"], f"{name}: {parsed.get('error')}"
        assert parsed["tokenizer_type"] == "HuggingFaceTokenizer" and parsed["tokenizer_model"] == "/models/Qwen3"
        assert parsed["transformer_impl"] == "local" and parsed["ckpt_format"] == "torch"
        # the dense scripts keep MindSpeed's fused attention through ascend_patch's qwen3 spec; MoE ones the local spec
        dense = "--num-experts" not in launch.args
        assert parsed["spec"] == (["qwen3"] if dense else None) and parsed["qk_layernorm"] is True, name
        assert parsed["use_flash_attn"] is False and parsed["position_embedding_type"] == "rope"
        given = {g: v for g, v in zip(launch.args, launch.args[1:]) if g.startswith("--")}
        tp = int(given["--tensor-model-parallel-size"])
        if release == "0.12.1":  # no --padded-vocab-size: 151936 rows through the divisor
            assert parsed["make_vocab_size_divisible_by"] * tp == 151936, name
            assert parsed["tokenizer_hf_use_fast"] == "<absent>"
        else:
            assert parsed["padded_vocab_size"] == 151936 and parsed["tokenizer_hf_use_fast"] is True
        if "--context-parallel-algo" in given:
            algo = {"megatron_cp_algo": "p2p", "ulysses_cp_algo": "a2a"}[given["--context-parallel-algo"]]
            assert parsed["cp_comm_type"] == [algo], name
        if given.get("--moe-token-dispatcher-type") == "alltoall_seq":
            assert parsed["moe_token_dispatcher_type"] == ("alltoall_seq" if release == "0.12.1" else "alltoall")
        if "--disable-gloo-group" in launch.args:  # kept by stock for the legacy distributed-optimizer checkpoint
            gloo = next(r for r in migration.rows if r.flag == "--disable-gloo-group")
            assert gloo.action is (Action.DROPPED if "--use-distributed-optimizer" in launch.args else Action.TRANSLATED)
            assert parsed["enable_gloo_process_groups"] is (gloo.action is Action.DROPPED)
        if "--noop-layers" in given and release == "0.16.1":
            layers, noop = int(given["--num-layers"]), given["--noop-layers"].split(",")
            assert parsed["num_layers"] == layers - len(noop)
            assert parsed["num_layers_per_virtual_pipeline_stage"] is None
            assert parsed["pipeline_model_parallel_layout"] is not None
        if "--enable-hf2mg-convert" in launch.args:
            tp, pp = given["--tensor-model-parallel-size"], given["--pipeline-model-parallel-size"]
            assert parsed["load"] == f"/ckpt/in_megatron_cache_tp{tp}pp{pp}ep1"
            assert migration.before and migration.before[0].startswith("ascend-patch convert --load-model-type hf")
        assert not [r for r in migration.rows if r.action is Action.KEPT and r.flag.startswith("--")
                    and r.flag not in launch.args], "a kept row names a flag the launch did not give"
