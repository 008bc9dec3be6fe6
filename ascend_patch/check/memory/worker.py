"""The estimating process: ``python -m ascend_patch.check.memory.worker JOB.json RESULT.json``.

``ascend-patch check --memory`` never patches or imports Megatron itself: :func:`estimate_memory`
writes the job to a file and runs this module in a child process, which applies the patch for
the cpu target, puts the launch's Megatron-LM first on ``sys.path`` (a checkout shadows an
installed megatron-core, as on the cluster) and runs :func:`.job.run_job`. Megatron's own
printing goes to a log file, named in the error when the estimate fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from ...errors import AscendPatchError

__all__ = ["EstimateFailed", "estimate_many", "estimate_memory", "main"]


class EstimateFailed(AscendPatchError, RuntimeError):
    """The estimating process failed; the message ends with its output's tail."""


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry: run the job in ``argv[0]``, write the result to ``argv[1]``."""
    job_path, result_path = (argv if argv is not None else sys.argv[1:])[:2]
    with open(job_path) as f:
        job = json.load(f)
    import ascend_patch

    ascend_patch.apply(ascend_patch.Settings(device="cpu"))
    from .job import run_job

    def run(one: dict) -> dict:
        try:
            return run_job(one)
        except AscendPatchError as exc:
            finding = getattr(exc, "finding", None)
            return {"error": str(exc), "code": getattr(finding, "code", "memory-estimate")}

    result: Any = [run(one) for one in job["jobs"]] if "jobs" in job else run(job)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


def _run_child(job: dict[str, Any], timeout: float | None, log: str | None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env["ASCEND_PATCH"] = "0"  # the child applies the cpu target itself, explicitly
    with tempfile.TemporaryDirectory(prefix="ascend-patch-memory-") as tmp:
        job_path, result_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        log_path = log or os.path.join(tmp, "estimate.log")
        with open(job_path, "w") as f:
            json.dump(job, f)
        with open(log_path, "w") as out:
            try:
                done = subprocess.run([sys.executable, "-m", "ascend_patch.check.memory.worker", job_path, result_path],
                                      stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise EstimateFailed(f"the memory estimate did not finish in {timeout:.0f} s") from None
        if done.returncode != 0 or not os.path.exists(result_path):
            with open(log_path, errors="replace") as f:
                tail = "\n".join(line for line in f.read().splitlines()[-40:] if "Warning" not in line)
            raise EstimateFailed(f"the memory estimate failed (exit status {done.returncode}):\n{tail}")
        with open(result_path) as f:
            return json.load(f)


def estimate_many(jobs: Sequence[dict[str, Any]], timeout: float | None = None, log: str | None = None) -> list[dict]:
    """Several jobs (each as :func:`estimate_memory` builds it: ``{"launch": [...], ...}``) in one child process."""
    return _run_child({"jobs": list(jobs)}, timeout, log)


def estimate_memory(launch: Sequence[str], *, device_bytes: int | None = None, target: str = "npu",
                    vocab_size: int | None = None, margin: float | None = None, runtime_reserved: int | None = None,
                    remedies: bool = True, timeout: float | None = None, log: str | None = None,
                    **options: Any) -> dict[str, Any]:
    """Estimate the launch line ``launch`` in a child process; the result as :func:`.job.run_job` returns it.

    A launch the estimate cannot run gives ``{"error": ..., "code": ...}``; a crash of the
    child raises :class:`EstimateFailed` with the tail of its output. ``options`` go into the job
    as they are (``state_only``: parameters, gradients and optimizer state only;
    ``first_role_only``: the first pipeline stage only).
    """
    job: dict[str, Any] = {"launch": list(launch), "device_bytes": device_bytes, "target": target,
                           "vocab_size": vocab_size, "remedies": remedies, **options}
    if margin is not None:
        job["margin"] = margin
    if runtime_reserved is not None:
        job["runtime_reserved"] = runtime_reserved
    return _run_child(job, timeout, log)


if __name__ == "__main__":
    sys.exit(main())
