"""Helpers for the megatron-core tests: the one-process ``mcore_world`` fixture, and running
examples/pretrain_gpt.py patched under torchrun.

(No conftest.py here: the test modules of other folders import the top-level ``conftest``
by name, which a second conftest.py would shadow. Test modules import the fixture.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from helpers import REPO, child_env, free_port

__all__ = ["EXAMPLE", "REPO", "ExampleLaunch", "child_env", "free_port", "mcore_world", "run_example", "start_example",
           "wait_examples"]

EXAMPLE = os.path.join(REPO, "examples", "pretrain_gpt.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")




def run_example(workdir, nproc: int, *args: str, timeout: int = 600) -> list[dict]:
    """Run the example patched under torchrun; returns its per-iteration loss records."""
    return start_example(workdir, nproc, *args, timeout=timeout).wait()


def start_example(workdir, nproc: int, *args: str, timeout: int = 600) -> "ExampleLaunch":
    """:func:`run_example` without waiting, so independent launches can run side by side."""
    return ExampleLaunch(workdir, nproc, args, timeout)


class ExampleLaunch:
    """A started example launch; its output goes to files in the workdir, never to a pipe that could fill
    up while the test waits for another launch."""

    def __init__(self, workdir, nproc: int, args: tuple[str, ...], timeout: int) -> None:
        tag = uuid.uuid4().hex[:12]  # unique among the launches of one workdir, side by side too
        self.log = os.path.join(workdir, f"losses-{tag}.jsonl")
        self.cmd = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "-m",
                    "ascend_patch", EXAMPLE, "--loss-log", self.log, *args]
        self.out, self.err = (os.path.join(workdir, f"example-{tag}.{kind}") for kind in ("out", "err"))
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=workdir, env=child_env(OMP_NUM_THREADS="1"), stdout=out,
                                         stderr=err, text=True, start_new_session=True)

    def kill(self) -> None:
        """End torchrun and its workers if they still run."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self) -> list[dict]:
        """The per-iteration loss records; an AssertionError with the output's tail if the launch failed."""
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{' '.join(self.cmd)} did not finish in {self.timeout} s") from None
        if self.proc.returncode != 0:
            with open(self.out) as out, open(self.err) as err:
                raise AssertionError(f"{' '.join(self.cmd)} failed ({self.proc.returncode}):\n{out.read()[-3000:]}\n"
                                     f"{err.read()[-6000:]}")
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(line) for line in f]


def wait_examples(*launches: ExampleLaunch) -> list[list[dict]]:
    """The records of launches started side by side, in order; if one fails the others are ended too."""
    try:
        return [launch.wait() for launch in launches]
    finally:
        for launch in launches:
            launch.kill()


@pytest.fixture
def mcore_world(patched, tmp_path):
    """The cpu target applied, a gloo world of one process, megatron-core's parallel state (1x1)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    try:
        yield patched
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
