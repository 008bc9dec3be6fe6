"""Shared by the memory tests: vendored Megatron-LM releases, real measured runs, and estimates of the same launches.

:func:`megatron_lm_dir` unpacks a vendored Megatron-LM snapshot (``shared/vendor/megatron-lm-core_v<release>.tar.gz``,
found above the repository; ``MEGATRON_LM_DIR`` overrides 0.16.1); :func:`measure` runs a launch for real under
``torchrun -m ascend_patch.check.memory.measure`` on the cpu target and returns every rank's measured terms;
:func:`estimate` runs the estimate of several launches in one child process.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from helpers import REPO, child_env

__all__ = ["TERMS", "estimate", "measure", "megatron_lm_dir", "unpack_release"]

TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")


def _tarball(release: str) -> Path:
    name = f"megatron-lm-core_v{release}.tar.gz"
    for parent in Path(REPO).resolve().parents:
        candidate = parent / "shared" / "vendor" / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name} not found in a shared/vendor folder above {REPO}")


def unpack_release(release: str, into: Path) -> Path:
    """The Megatron-LM directory (holding pretrain_gpt.py) of ``release``, unpacked into ``into``."""
    if release == "0.16.1" and os.environ.get("MEGATRON_LM_DIR"):
        return Path(os.environ["MEGATRON_LM_DIR"])
    with tarfile.open(_tarball(release)) as tar:
        tar.extractall(into, filter="data")
    return Path(sorted(glob.glob(str(into / "*" / "pretrain_gpt.py")))[0]).parent


def megatron_lm_dir(tmp_path_factory, release: str = "0.16.1") -> Path:
    """Unpack ``release`` once into a fresh temporary folder."""
    return unpack_release(release, tmp_path_factory.mktemp(f"mlm-{release}"))


def measure(root: Path, args: list[str], nproc: int, work: Path, timeout: float = 300) -> dict[int, dict]:
    """Run ``pretrain_gpt.py ARGS`` for real on ``nproc`` cpu processes; rank -> its measured record."""
    out = work / "measured"
    env = child_env(ASCEND_PATCH_DEVICE="cpu", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(root), REPO, env.get("PYTHONPATH", "")])
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(nproc), "-m", "ascend_patch.check.memory.measure", "--out", str(out),
                           str(root / "pretrain_gpt.py"), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return {int(Path(p).stem[4:]): json.load(open(p)) for p in glob.glob(str(out / "rank*.json"))}


def estimate(jobs: list[dict], work: Path, timeout: float = 600) -> list[dict]:
    """The estimate of each job (``{"launch": [...], ...}``), all in one child process (one Megatron-LM)."""
    from ascend_patch.check.memory.worker import estimate_many

    work.mkdir(parents=True, exist_ok=True)
    results = estimate_many(jobs, timeout=timeout, log=str(work / "estimate.log"))
    for job, result in zip(jobs, results):
        assert "error" not in result, (job["launch"], result)
    return results
