"""Hugging Face Trainer (transformers + accelerate) on the cpu target: torchrun, DataParallel, --bf16.

The reference is one process on one device with the global batch (4 sequences a step).
Under ``torchrun --nproc-per-node 2 -m ascend_patch`` each rank takes 2 of them and the
run must be distributed (accelerate's MULTI_GPU over gloo), not two independent
processes; with ``CUDA_VISIBLE_DEVICES=0,1`` one process sees 2 devices and Trainer
wraps the model in nn.DataParallel (n_gpu = 2). Every loss must equal the reference's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, child_env, free_port

pytestmark = pytest.mark.slow

pytest.importorskip("accelerate")

SCRIPT = os.path.join(REPO, "tests", "integration", "hf_trainer_script.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def train(tmp_path, name: str, launch: list[str], batch: int, *flags: str, **env: str) -> list[dict]:
    out = tmp_path / name
    args = ["--output_dir", str(out), "--per_device_train_batch_size", str(batch), "--max_steps", "3",
            "--learning_rate", "1e-2", "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no",
            "--seed", "0", "--disable_tqdm", "true", *flags]
    done = subprocess.run([*launch, "-m", "ascend_patch", SCRIPT, *args], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(ASCEND_PATCH_DEVICE="cpu", **env), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(results, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    (one,) = train(tmp_path_factory.mktemp("one"), "one", [sys.executable], 4)
    assert (one["n_gpu"], one["world"], one["distributed"]) == (1, 1, "NO")
    assert len(one["losses"]) == 3
    return one


def test_torchrun_goes_distributed_with_the_single_process_loss(tmp_path, reference):
    ranks = train(tmp_path, "ddp", [*TORCHRUN, "--master-port", str(free_port())], 2)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["distributed"], r["world"], r["n_gpu"]) == ("MULTI_GPU", 2, 1)
        assert r["device"] == f"cuda:{r['rank']}"  # each rank on its own (virtual) device
        assert r["losses"] == pytest.approx(reference["losses"], rel=2e-6)


def test_data_parallel_over_two_virtual_devices_gives_the_one_device_loss(tmp_path, reference):
    (dp,) = train(tmp_path, "dp", [sys.executable], 2, CUDA_VISIBLE_DEVICES="0,1")
    assert (dp["n_gpu"], dp["world"], dp["distributed"]) == (2, 1, "NO")
    assert dp["losses"] == pytest.approx(reference["losses"], rel=2e-6)  # not 2x: loss.mean() over 2 replicas


def test_bf16_is_honoured_under_torchrun(tmp_path, reference):
    ranks = train(tmp_path, "bf16", [*TORCHRUN, "--master-port", str(free_port())], 2, "--bf16", "true")
    for r in ranks:
        assert r["distributed"] == "MULTI_GPU" and r["mixed_precision"] == "bf16"
        assert r["dtypes"] == ["torch.bfloat16"]  # the forward ran under bf16 autocast
        assert r["losses"] == pytest.approx(reference["losses"], rel=2e-3)  # bf16 rounding, same training
