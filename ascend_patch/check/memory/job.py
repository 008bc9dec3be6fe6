"""One ``check --memory`` job, run in the estimating process: the launch, its roles, and the remedies.

:func:`run_job` takes the job as plain data (what :mod:`.worker` reads from its file) and
returns the result as plain data: per role the four tensor terms, the non-tensor lines, the
communicators it used and every value-dependent question the simulation answered; whether
every rank fits; and, when one does not, each candidate change of :mod:`.remedies`
re-estimated.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

from ...errors import AscendPatchError
from .estimate import RoleEstimate, estimate_argv, estimate_roles, roles
from .launchline import LaunchLine, parse_launch_line
from .overheads import DEFAULT_MARGIN, DEFAULT_RUNTIME_RESERVED, overheads
from .remedies import candidates

__all__ = ["run_job"]


def _megatron_version() -> str:
    try:
        from megatron.core import package_info

        return str(package_info.__version__)
    except ImportError:  # pragma: no cover - the estimate needs megatron
        return "unknown"


def _rows(results: list[RoleEstimate], job: dict, env: dict[str, str]) -> list[dict]:
    rows = []
    for r in results:
        groups = set(r.communicators)
        lines = overheads(job.get("target", "npu"), r.terms.peak_bytes, len(groups), len(r.p2p_peers), env,
                          job.get("margin", DEFAULT_MARGIN), job.get("runtime_reserved", DEFAULT_RUNTIME_RESERVED),
                          p2p_only_groups=len(set(r.p2p_groups) - groups))
        buffers = sum(x.bytes for x in lines)
        t = r.terms
        rows.append({
            "role": r.role.name, "ranks": list(r.role.ranks), "rank": r.role.rank,
            "params_bytes": t.params_bytes, "grads_bytes": t.grads_bytes, "optimizer_bytes": t.optimizer_bytes,
            "activations_bytes": t.activations_bytes, "buffers_bytes": buffers,
            "total_bytes": t.tensor_bytes + buffers, "overheads": [asdict(x) for x in lines],
            "asked": [list(a) for a in r.asked], "communicators": len(groups), "p2p_peers": len(r.p2p_peers),
            "num_microbatches": r.num_microbatches, "seconds": round(r.seconds, 2), "megatron_formula": r.formula,
        })
    return rows


def _estimate(line: LaunchLine, job: dict, env: dict[str, str]) -> tuple[list[dict], list[str], list[str]]:
    argv, notes = estimate_argv(line, job.get("vocab_size"))
    which = roles(line, argv)
    if job.get("first_role_only"):
        which = which[:1]
    results = estimate_roles(line, argv, which, state_only=bool(job.get("state_only")))
    return _rows(results, job, env), argv, notes


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Estimate ``job["launch"]`` (the tokens after ``--``); this process must be patched for cpu."""
    start = time.perf_counter()
    line = parse_launch_line(job["launch"])
    env = {**{k: v for k, v in os.environ.items() if k.endswith("HCCL_BUFFSIZE")}, **line.env}
    rows, argv, notes = _estimate(line, job, env)
    device = job.get("device_bytes")
    fits = device is None or all(row["total_bytes"] <= device for row in rows)
    remedies = []
    if not fits and job.get("remedies", True):
        for candidate in candidates(line):
            changed = LaunchLine(line.script, list(candidate.argv), line.nnodes, line.nproc_per_node, line.env)
            try:
                variant, _, _ = _estimate(changed, job, env)
            except (AscendPatchError, ValueError, RuntimeError, AssertionError) as exc:
                remedies.append({"change": candidate.change, "total_bytes": None, "fits": False,
                                 "error": str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__})
                continue
            worst = max(row["total_bytes"] for row in variant)
            remedies.append({"change": candidate.change, "total_bytes": worst, "fits": worst <= device,
                             "error": None})
    return {"script": line.script, "world_size": line.world_size, "nnodes": line.nnodes,
            "nproc_per_node": line.nproc_per_node, "megatron": _megatron_version(), "argv": argv, "notes": notes,
            "roles": rows, "device_bytes": device, "fits": fits, "remedies": remedies,
            "target": job.get("target", "npu"), "seconds": round(time.perf_counter() - start, 2)}
