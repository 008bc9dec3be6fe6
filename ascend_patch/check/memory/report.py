"""The memory section of ``ascend-patch check``: the per-role table, the findings, the stated assumptions.

:func:`memory_findings` turns a result of :func:`.job.run_job` into findings (a rank that does
not fit is an error whose remedy lists the re-estimated changes that bring it under);
:func:`format_memory` prints the table and every line's source; :func:`memory_json` is the
``--format json`` document.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import Finding
from .chips import format_bytes

__all__ = ["LIMITS", "NEGLIGIBLE", "format_memory", "memory_findings", "memory_json", "saved_bytes"]

# a change that lowers the worst rank by less than this fraction of it saves nothing worth offering
# (e.g. selective recomputation of core attention when the attention kernel stores no S x S matrix: it frees
# only the softmax statistics, and the checkpoint keeps the attention mask alive instead)
NEGLIGIBLE = 0.001

LIMITS = ("What the estimate models: the launch's own Megatron code, layout, schedule (the micro-batches in flight), "
          "recomputation, distributed-optimizer sharding and MoE dispatch, with tokens spread evenly over the "
          "experts; live tensors as torch's MemTracker tracks them. What it cannot: dropped or unevenly routed "
          "tokens, dynamic shapes (variable or packed sequences), the caching allocator's real behaviour on HBM (a "
          "stated margin stands for it), and the workspaces of fused NPU kernels (their cpu-target implementations' "
          "tensors are counted instead). Nothing here was measured on an NPU.")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    shown = ",".join(map(str, ranks[:6]))
    return shown + (f",... ({len(ranks)})" if len(ranks) > 6 else "")


def memory_json(result: dict[str, Any]) -> str:
    """The ``--format json`` document: per-role terms, the device's bytes, and whether every rank fits."""
    keys = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "total_bytes")
    ranks = [{"role": row["role"], "ranks": row["ranks"], **{k: int(row[k]) for k in keys}}
             for row in result.get("roles", [])]
    return json.dumps({"ranks": ranks, "device_bytes": result.get("device_bytes"), "fits": bool(result.get("fits"))},
                      indent=2)


def saved_bytes(result: dict[str, Any], remedy: dict[str, Any]) -> int | None:
    """How much lower the worst rank is with ``remedy``'s change than without it (None: not estimated)."""
    if remedy.get("total_bytes") is None or not result.get("roles"):
        return None
    return max(row["total_bytes"] for row in result["roles"]) - remedy["total_bytes"]


def _saves_nothing(result: dict[str, Any], remedy: dict[str, Any]) -> bool:
    saved = saved_bytes(result, remedy)
    worst = max((row["total_bytes"] for row in result.get("roles", [])), default=0)
    return saved is not None and saved < NEGLIGIBLE * worst


def _saving(result: dict[str, Any], remedy: dict[str, Any]) -> str:
    saved = saved_bytes(result, remedy)
    if saved is None:
        return ""
    if _saves_nothing(result, remedy):
        how = f"{format_bytes(-saved)} more" if saved < 0 else f"{format_bytes(saved)} less"
        return f"saves 0 ({how}: under {NEGLIGIBLE:.1%} of the worst rank)"
    return f"saves {format_bytes(saved)}"


def memory_findings(result: dict[str, Any], device_name: str = "the device") -> tuple[list[Finding], list[Finding]]:
    """(errors, warnings) of a memory result."""
    if "error" in result:
        return [Finding(result.get("code", "memory-estimate"), f"the memory estimate could not run: {result['error']}")], []
    device = result.get("device_bytes")
    errors: list[Finding] = []
    warnings: list[Finding] = []
    if device is None:
        return errors, warnings
    fitting = sorted((r for r in result.get("remedies", []) if r["fits"]), key=lambda r: r["total_bytes"])
    not_enough = [r for r in result.get("remedies", []) if not r["fits"] and r["total_bytes"] is not None
                  and not _saves_nothing(result, r)]
    useless = [r["change"] for r in result.get("remedies", []) if _saves_nothing(result, r)]
    for row in result["roles"]:
        over = row["total_bytes"] - device
        ranks = f"{row['role']} (ranks {_ranks(row['ranks'])})"
        if over > 0:
            if fitting:
                remedy = "each of these brings every rank under (re-estimated): " + "; ".join(
                    f"{r['change']} -> {format_bytes(r['total_bytes'])}" for r in fitting)
            else:
                tried = "; ".join(f"{r['change']} -> {format_bytes(r['total_bytes'])}" for r in not_enough)
                remedy = ("no single change brings it under" + (f" (re-estimated: {tried})" if tried else "")
                          + "; combine them, or use more devices")
            if useless:
                remedy += f" ({'; '.join(useless)}: re-estimated, saves 0 here)"
            errors.append(Finding("memory-oom", f"{ranks} needs {format_bytes(row['total_bytes'])} but {device_name} "
                                  f"has {format_bytes(device)}: {format_bytes(over)} over", remedy))
        elif row["total_bytes"] > 0.95 * device:
            warnings.append(Finding("memory-headroom", f"{ranks} needs {format_bytes(row['total_bytes'])} of "
                                    f"{format_bytes(device)}: less than 5 % headroom",
                                    "a real step's allocator behaviour may differ from the stated margin"))
    return errors, warnings


def _table(result: dict[str, Any]) -> list[str]:
    device = result.get("device_bytes")
    heads = ["role", "ranks", "params", "grads", "optimizer", "activations", "buffers", "total"]
    if device is not None:
        heads.append("headroom")
    rows = []
    for row in result["roles"]:
        cells = [row["role"], _ranks(row["ranks"])] + [format_bytes(row[k]) for k in (
            "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "total_bytes")]
        if device is not None:
            cells.append(format_bytes(device - row["total_bytes"]))
        rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    fmt = ["  ".join((c.ljust if i < 2 else c.rjust)(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    header = "  ".join((h.ljust if i < 2 else h.rjust)(w) for i, (h, w) in enumerate(zip(heads, widths)))
    return [header, "  ".join("-" * w for w in widths), *fmt]


def format_memory(result: dict[str, Any], device_name: str = "") -> str:
    """The memory section as ``ascend-patch check --memory`` prints it."""
    if "error" in result:
        return f"memory: the estimate could not run: {result['error']}"
    device = result.get("device_bytes")
    where = f", device {format_bytes(device)}" + (f" ({device_name})" if device_name else "") if device else ""
    out = [f"memory: {result['script']} on {result['world_size']} ranks, megatron-core {result['megatron']}{where}, "
           f"target {result['target']}",
           f"  Megatron-LM's own pretrain ran one simulated rank per role on fake tensors ({len(result['roles'])} "
           f"role(s), {result['seconds']:.1f} s)", ""]
    out += _table(result)
    for row in result["roles"]:
        out += ["", f"{row['role']}: non-tensor lines"]
        out += [f"  {o['name']:<28} {format_bytes(o['bytes']):>11}  {o['source']}" for o in row["overheads"]]
    formula = result["roles"][0].get("megatron_formula", {}) if result["roles"] else {}
    if any(v is not None for v in formula.values()):
        shown = {k: format_bytes(v) if v is not None else "none" for k, v in formula.items()}
        state = result["roles"][0]
        state_bytes = state["params_bytes"] + state["grads_bytes"] + state["optimizer_bytes"]
        out += ["", f"Megatron-LM's own formula (theoretical_memory_usage.py), for comparison only, "
                f"{result['roles'][0]['role']}: weights and optimizer {shown.get('weight_and_optimizer_bytes')} "
                f"(estimated here: {format_bytes(state_bytes)}), activations {shown.get('activations_bytes')} "
                f"(estimated here: {format_bytes(state['activations_bytes'])}); docs/memory.md says which the tracked "
                "runs support"]
    asked: dict[tuple[str, str, str], int] = {}
    for row in result["roles"]:
        for q, a, where_, n in row["asked"]:
            asked[(q, a, where_)] = asked.get((q, a, where_), 0) + n
    out += ["", "assumptions:"] + [f"  - {n}" for n in result.get("notes", [])]
    out += [f"  - {q} -> {a} at {w} ({n}x)" for (q, a, w), n in sorted(asked.items(), key=lambda kv: -kv[1])]
    if result.get("remedies"):
        out += ["", "changes re-estimated:"]
        for r in result["remedies"]:
            got = format_bytes(r["total_bytes"]) if r["total_bytes"] is not None else f"not estimated: {r['error']}"
            saving = _saving(result, r)
            out.append(f"  {r['change']:<84} {got}{'  ' + saving if saving else ''}{'  fits' if r['fits'] else ''}")
    out += ["", LIMITS]
    return "\n".join(out)
