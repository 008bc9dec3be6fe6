"""Run Megatron-LM's own ``pretrain_gpt.py``, unchanged, under ``torchrun -m ascend_patch``.

The Megatron-LM snapshot (``megatron-lm-core_v0.16.1.tar.gz``: ``pretrain_gpt.py``,
``gpt_builders.py``, ``model_provider.py``, ``megatron/{training,legacy,rl,post_training}``) is a
test input kept outside the repository, in ``shared/vendor/`` next to (a parent of) the checkout;
``MEGATRON_LM_TARBALL`` names another copy and ``MEGATRON_LM_DIR`` an unpacked Megatron-LM
checkout to use as is. The tests' conftest unpacks it once per session (fixture
``megatron_lm``); :meth:`MegatronLM.run` then launches::

    python -m torch.distributed.run --standalone --nproc-per-node N -m ascend_patch pretrain_gpt.py ARGS

with the Megatron-LM directory first on ``PYTHONPATH`` and this repository after it, in a working
directory of the test's own (checkpoints, logs), on the cpu target, with a timeout that kills the
whole process group. Every iteration's numbers come from ``ASCEND_PATCH_TRAINING_LOG`` (the
product's full-precision log of Megatron's ``training_log``), and the printed log lines are parsed
too, so a test can check the two agree.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers import REPO, child_env

__all__ = ["MegatronLM", "MegatronRun", "MegatronRunFailed", "TINY_GPT", "find_tarball", "unpack"]

TARBALL_NAME = "megatron-lm-core_v0.16.1.tar.gz"

# A tiny GPT on mock data: each iteration takes well under a second on one core. Seeded, fp32,
# Megatron's defaults otherwise (dropout 0.1, tied embeddings, learned absolute positions).
TINY_GPT: tuple[str, ...] = (
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--seed", "1234",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000",
)

_ITERATION = re.compile(r"\] iteration\s+(\d+)/\s*\d+ \|")
_LOSS = re.compile(r"\| lm loss: (\S+) \|")
_NORM = re.compile(r"\| grad norm: (\S+) \|")


class MegatronRunFailed(AssertionError):
    """The launch exited non-zero or timed out; the message ends with the output's tail."""


@dataclass
class MegatronRun:
    """One launch: its per-iteration records (full precision), printed lines and output."""

    args: list[str]
    returncode: int
    output: str
    workdir: Path
    records: list[dict] = field(default_factory=list)  # ASCEND_PATCH_TRAINING_LOG lines, in order
    printed: dict[int, tuple[float, float | None]] = field(default_factory=dict)  # iteration -> (lm loss, grad norm)

    @property
    def iterations(self) -> list[int]:
        return [r["iteration"] for r in self.records]

    @property
    def losses(self) -> list[float]:
        """``lm loss`` per iteration, in the order logged."""
        return [r["losses"]["lm loss"] for r in self.records]

    @property
    def grad_norms(self) -> list[float]:
        return [r["grad_norm"] for r in self.records]

    def record(self, iteration: int) -> dict:
        """The record of ``iteration`` (the last one logged, if a resumed run logged it twice)."""
        found = [r for r in self.records if r["iteration"] == iteration]
        if not found:
            raise KeyError(f"iteration {iteration} was not logged; logged: {self.iterations}")
        return found[-1]


def find_tarball() -> Path:
    """The vendored Megatron-LM tarball: ``MEGATRON_LM_TARBALL``, else ``shared/vendor`` above the repo."""
    named = os.environ.get("MEGATRON_LM_TARBALL")
    if named:
        return Path(named)
    looked = []
    for parent in Path(REPO).resolve().parents:
        candidate = parent / "shared" / "vendor" / TARBALL_NAME
        looked.append(str(candidate))
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{TARBALL_NAME} not found (looked at {', '.join(looked)}); set MEGATRON_LM_TARBALL "
                            "to its path or MEGATRON_LM_DIR to an unpacked Megatron-LM checkout")


def unpack(tarball: Path, into: Path) -> Path:
    """Unpack ``tarball`` into ``into``; returns the directory holding ``pretrain_gpt.py``."""
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    found = sorted(into.glob("*/pretrain_gpt.py")) or sorted(into.glob("pretrain_gpt.py"))
    if not found:
        raise FileNotFoundError(f"{tarball} holds no pretrain_gpt.py")
    return found[0].parent


class MegatronLM:
    """A Megatron-LM directory (``pretrain_gpt.py`` and ``megatron/``) to launch runs from."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.script = self.root / "pretrain_gpt.py"

    def run(self, args: Sequence[str], workdir: Path, nproc: int = 1, *, env: Mapping[str, str] | None = None,
            timeout: float = 300, check: bool = True) -> MegatronRun:
        """Launch ``pretrain_gpt.py ARGS`` on ``nproc`` processes in ``workdir`` and collect its numbers.

        ``env`` adds or overrides variables (e.g. ``CUDA_DEVICE_MAX_CONNECTIONS``). With ``check``
        (the default) a non-zero exit or a timeout raises :class:`MegatronRunFailed` with the
        output's tail. A second run in the same ``workdir`` (a resume) appends to its records.
        """
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "iterations.jsonl"
        first_new = _line_count(log)
        environ = child_env(ASCEND_PATCH_DEVICE="cpu", ASCEND_PATCH_TRAINING_LOG=str(log), OMP_NUM_THREADS="1")
        environ["PYTHONPATH"] = os.pathsep.join([str(self.root), REPO, environ.get("PYTHONPATH", "")])
        environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # what a user who never set it has
        environ.update(env or {})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "ascend_patch", str(self.script), *args]
        proc = subprocess.Popen(cmd, cwd=workdir, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            raise MegatronRunFailed(f"pretrain_gpt.py did not finish in {timeout:.0f} s: "
                                    f"{' '.join(args)}\n{_tail(output)}") from None
        (workdir / f"output-{len(list(workdir.glob('output-*.log')))}.log").write_text(output)
        if check and proc.returncode != 0:
            raise MegatronRunFailed(f"pretrain_gpt.py exited {proc.returncode}: {' '.join(args)}\n{_tail(output)}")
        records = _read_records(log)[first_new:] if log.exists() else []
        return MegatronRun(list(args), proc.returncode, output, workdir, records, _printed(output))


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _printed(output: str) -> dict[int, tuple[float, float | None]]:
    found = {}
    for line in output.splitlines():
        iteration, loss, norm = _ITERATION.search(line), _LOSS.search(line), _NORM.search(line)
        if iteration and loss:
            found[int(iteration.group(1))] = (float(loss.group(1)), float(norm.group(1)) if norm else None)
    return found


def _tail(output: str, lines: int = 60) -> str:
    kept = [line for line in output.splitlines() if "Warning" not in line and not line.startswith("  warn")]
    return "\n".join(kept[-lines:])
