"""The coverage table (docs/coverage.md), generated from the live patch table.

``ascend-patch report --markdown`` prints it; the doc is this output, so it cannot
drift from what the code does. The cpu column is what this process applied; the
npu column says what the same entry point becomes with torch_npu (the npu target
was not run here: no NPU).
"""

from __future__ import annotations

from collections import defaultdict

from ..patch import PatchKind
from .report import Report

__all__ = ["coverage_markdown", "replace_table"]

_CPU_ACTION = {"emulated": "emulated", "no-op": "no-op", "translated": "translated",
               "unsupported": "raises UnsupportedOnTarget"}


def _npu_column(target: str, backends: frozenset[str]) -> str:
    module, _, attr = target.partition(":")
    if "npu" not in backends:
        return "not patched: torch_npu's own behaviour"
    if module == "torch.cuda" and not attr.startswith("_") and attr != "is_available":
        return f"`torch.npu.{attr}`, or raises UnsupportedOnTarget if torch_npu lacks it"
    if module == "torch.cuda.nvtx":
        return "profiler range (`torch.profiler.record_function`)"
    return "the same adaptor, onto `npu` / `npu:N`"


def coverage_markdown(report: Report) -> str:
    groups: dict[str, list[str]] = defaultdict(list)
    rows: list[tuple[str, str, str, str]] = []
    for status in report.statuses:
        patch = status.patch
        if patch.kind is PatchKind.ENV or patch.kind is PatchKind.MODULE:
            continue
        if "translate device=" in patch.reason:
            groups["factory"].append(patch.shown_as)
            continue
        if patch.kind is PatchKind.ADD and status.detail == "already provided by the target":
            continue  # the thing it would add is there: nothing to cover
        action = patch.action.value
        cpu = f"{_CPU_ACTION.get(action, action)}: {patch.reason}"
        # deferred patches apply when their module is imported: the table covers what they do,
        # so it does not depend on what this process happened to import
        if status.state not in ("applied", "deferred"):
            cpu = f"{status.state}: {status.detail}"
        npu = _npu_column(patch.target, patch.backends)
        if patch.package and "npu" in patch.backends:
            npu = f"the same patch (checked against {patch.package} {patch.versions})"
        rows.append((patch.shown_as, cpu, npu))
    lines = [
        "| CUDA entry point | cpu target | npu target |",
        "|---|---|---|",
    ]
    factories = sorted(groups["factory"])
    if factories:
        names = ", ".join(f"`{n.removeprefix('torch.')}`" for n in factories)
        lines.append(f"| every torch function with a `device` argument ({len(factories)} on this torch, "
                     f"derived from its ATen schemas): {names} | `device=cuda/cuda:N/torch.device('cuda', N)/int`"
                     " -> `cpu` (exact matching only: a path containing 'cuda' is never rewritten) "
                     "| -> `npu` / `npu:N` (index kept) |")
    for api, cpu, npu in sorted(set(rows)):  # one row per entry point and behaviour
        lines.append(f"| `{api}` | {cpu} | {npu} |")
    return "\n".join(lines)


def replace_table(path: str, table: str) -> None:
    """Replace the coverage table (from its header row to the end) in the markdown file ``path``."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find("| CUDA entry point |")
    head = text if start < 0 else text[:start]
    with open(path, "w", encoding="utf-8") as f:
        f.write(head.rstrip("\n") + "\n\n" + table + "\n")
