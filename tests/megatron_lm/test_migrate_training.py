"""MindSpeed-LLM's pretrain scripts, scaled down, train on stock Megatron-LM under ascend_patch.

Each vendored pretrain script is scaled down (:func:`msl_scripts.scaled`: every flag kept; layers,
hidden sizes, sequence, iterations, learning rate and parallel sizes made tiny, 2 processes on one
node) and run **verbatim**: its MindSpeed-LLM flags given to ``torchrun -m ascend_patch
pretrain_gpt.py``, where the migrate plugin translates them. The data is MindSpeed-LLM's pretraining
format, ``<prefix>_text_document`` written with megatron-core's IndexedDatasetBuilder; the tokenizer
a local byte-level HF tokenizer. The MoE script also runs as the bash script ``ascend-patch migrate``
prints, and gives the verbatim run's losses. The 0.6B script loads a
checkpoint in MindSpeed-LLM's converter layout (its ``--exit-on-missing-checkpoint`` makes a failed
load fatal), the 8B script's ``--enable-hf2mg-convert`` gets its conversion step first; a tune script
is refused before training with ``migrate``'s message.

Training runs on megatron-core 0.16.1 (``TRAIN_RELEASES``); 0.12.1 is a parameter to switch on when
that release trains under the patch (its snapshot is unpacked the same way).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, child_env, free_port
from mlm_harness import MegatronLM, MegatronRun, cli, find_tarball, periodic_data, tiny_hf_model, unpack
from msl_checkpoint import write_msl_checkpoint
from msl_scripts import VOCAB, examples_dir, filled, pretrain_scripts, scaled, tune_scripts, vendor_file

from ascend_patch.migrate import migrate_launch
from ascend_patch.migrate.rules import Action
from ascend_patch.migrate.script import read_script

TRAIN_RELEASES = ["0.16.1"]  # add "0.12.1" once that release trains under the patch
SCRIPTS = ["pretrain_qwen3_0point6b_4K_ptd.sh", "pretrain_qwen3_14b_4K_ptd.sh", "pretrain_qwen3_14b_4K_ptd_A3.sh",
           "pretrain_qwen3_1point7b_4K_ptd.sh", "pretrain_qwen3_32b_4K_ptd.sh", "pretrain_qwen3_32b_4K_ptd_A3.sh",
           "pretrain_qwen3_4b_4K_ptd.sh", "pretrain_qwen3_8b_4K_ptd.sh", "pretrain_qwen3_8b_4K_ptd_A3.sh",
           "pretrain_qwen3_235b_a22b_4k_A3_ptd.sh", "pretrain_qwen3_30b_a3b_4K_ptd.sh",
           "pretrain_qwen3_480b_4k_A3_ptd.sh"]
AS_SCRIPT = ["pretrain_qwen3_30b_a3b_4K_ptd.sh"]  # MoE, EP2 (one launch more: CI time)
PATTERN = np.random.default_rng(1).integers(11, VOCAB, 64)  # one training window (no EOD: id 10)
_runs: dict[tuple[str, str], MegatronRun] = {}


class World:
    """What the runs share: Megatron-LM, the examples, tokenizer, data, and the HF models made for loading."""

    def __init__(self, release: str, root: Path, work: Path) -> None:
        self.release, self.work = release, work
        self.megatron_lm = MegatronLM(root)
        self.mcore = examples_dir(work / "msl")
        from ascend_patch.demo.tiny_model import byte_tokenizer

        byte_tokenizer().save_pretrained(str(work / "tokenizer"))
        periodic_data(str(work / "corpus_text_document"), PATTERN, repeats=64)

    def script(self, name: str, load: Path | None = None, port: int | None = None) -> str:
        """The scaled-down copy of ``name`` with its paths filled."""
        path = next(p for p in [*pretrain_scripts(self.mcore), *tune_scripts(self.mcore)] if p.name == name)
        return filled(scaled(path.read_text()), TOKENIZER_PATH=str(self.work / "tokenizer"),
                      DATA_PATH=str(self.work / "corpus_text_document"),
                      CKPT_LOAD_DIR=str(load or self.work / "no-checkpoint"),
                      CKPT_SAVE_DIR=str(self.work / "saved" / name), MASTER_PORT=str(port or free_port()))


@pytest.fixture(scope="module", params=TRAIN_RELEASES)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> World:
    work = tmp_path_factory.mktemp(f"msl-train-{request.param}")
    tarball = find_tarball() if request.param == "0.16.1" else vendor_file(f"megatron-lm-core_v{request.param}.tar.gz")
    return World(request.param, unpack(tarball, work / "megatron-lm"), work)


def _hf_qwen3(path: Path, layers: int, tied: bool) -> object:
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=tied,
        rope_theta=1000000.0, rms_norm_eps=1e-6)
    return tiny_hf_model(config, transformers.Qwen3ForCausalLM, path)


def _hf_loss(model: object) -> float:
    import torch

    window = torch.tensor(np.concatenate([PATTERN, PATTERN[:1]]))
    with torch.no_grad():
        logits = model(window[None, :-1]).logits[0].double()  # type: ignore[operator]
    return torch.nn.functional.cross_entropy(logits, window[1:]).item()


def _verbatim(world: World, name: str) -> tuple[MegatronRun, float | None]:
    """Run the scaled-down script's own flags through pretrain_gpt.py (and what its first loss must be)."""
    expected, load = None, None
    if name.startswith("pretrain_qwen3_0point6b"):  # MindSpeed-LLM's converter layout, loaded and trained on
        model = _hf_qwen3(world.work / "hf-0.6b", layers=2, tied=True)
        write_msl_checkpoint(world.work / "hf-0.6b", world.work / "msl-ckpt")
        load, expected = world.work / "msl-ckpt", _hf_loss(model)
    elif name == "pretrain_qwen3_8b_4K_ptd.sh":  # --enable-hf2mg-convert: an HF model to convert first
        model = _hf_qwen3(world.work / "hf-8b", layers=4, tied=False)
        load, expected = world.work / "hf-8b", _hf_loss(model)
    launch = read_script(world.script(name, load))
    migration = migrate_launch(launch, megatron=world.release)
    for step in migration.before:
        assert step.startswith("ascend-patch convert "), step
        cli(*step.split()[1:])  # the step migrate prints, as a user runs it
    run = world.megatron_lm.run(list(launch.args), world.work / "runs" / name, nproc=2, timeout=600)
    _runs[(world.release, name)] = run
    return run, expected


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_scaled_script_trains_verbatim(world: World, name: str) -> None:
    run, expected = _verbatim(world, name)
    losses = run.losses
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.1, f"{name}: loss did not fall: {losses}"
    assert run.output.count("ascend_patch migrate: MindSpeed-LLM flags for stock Megatron-LM") == 1
    launch = read_script(world.script(name))
    changed = [r for r in migrate_launch(launch, megatron=world.release).rows
               if r.action is not Action.KEPT and r.flag.startswith("--")]
    assert changed and all(f"  {r.flag}" in run.output for r in changed)
    if expected is not None:  # loaded: iteration 1 was the converter's, the first loss is the HF model's
        if name.startswith("pretrain_qwen3_0point6b"):
            assert run.iterations[0] == 2
        assert abs(losses[0] - expected) / expected < 2e-3, (losses[0], expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", AS_SCRIPT)
def test_migrated_script_gives_the_verbatim_losses(world: World, name: str, tmp_path: Path) -> None:
    verbatim = _runs.get((world.release, name)) or _verbatim(world, name)[0]
    scaled_path = tmp_path / name
    scaled_path.write_text(world.script(name))
    migrated = cli("migrate", str(scaled_path), "--megatron-release", world.release)
    assert migrated.startswith("#!/bin/bash") and " -m ascend_patch pretrain_gpt.py " in migrated
    (tmp_path / "migrated.sh").write_text(migrated)
    (tmp_path / "logs").mkdir()
    os.symlink(world.megatron_lm.script, tmp_path / "pretrain_gpt.py")
    env = child_env(ASCEND_PATCH_DEVICE="cpu", ASCEND_PATCH_TRAINING_LOG=str(tmp_path / "log.jsonl"),
                    OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(world.megatron_lm.root), REPO])
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # torchrun, ascend-patch
    done = subprocess.run(["bash", "migrated.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json

    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["losses"]["lm loss"] for r in records] == verbatim.losses
    assert "ascend_patch migrate:" not in done.stdout  # stock flags only: nothing left to translate in-process
    assert (tmp_path / "logs").iterdir()  # the script's own `| tee logs/...` ran


@pytest.mark.slow
def test_tune_script_is_refused_before_training(world: World) -> None:
    name = "tune_qwen3_0point6b_4K_full_ptd.sh"
    launch = read_script(world.script(name))
    migration = migrate_launch(launch, megatron=world.release)
    assert {"posttrain_gpt.py", "--stage", "--is-instruction-dataset", "--prompt-type"} <= \
        {r.flag for r in migration.refused}
    run = world.megatron_lm.run(list(launch.args), world.work / "runs" / name, nproc=1, check=False, timeout=300)
    assert run.returncode != 0 and not run.records
    refused_flags = migration.refusal().splitlines()[1:]
    assert all(line in run.output for line in refused_flags if "posttrain_gpt.py" not in line)
