"""The coverage table (docs/coverage.md), generated from the live patch table.

``ascend-patch report --markdown`` prints it; the doc is this output, so it cannot
drift from what the code does. The cpu column is what this process applied; the
npu column says what the same entry point becomes with torch_npu (checked with the
torch_npu test double in tests/adaptors, not on an NPU). Entry points that only the
npu target patches, and the CUDA environment variables, are added from the tables
their adaptors use.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from ...patch import Add, EnvVar, ModuleShim

if TYPE_CHECKING:
    from ...patching.report import Report

__all__ = ["coverage_markdown", "replace_table"]

_CPU_ACTION = {"emulated": "emulated", "no-op": "no-op", "translated": "translated",
               "unsupported": "raises UnsupportedOnTarget"}


def _npu_column(target: str, backends: frozenset[str]) -> str:
    module, _, attr = target.partition(":")
    from .accelerator import NPU_THROUGH_DEVICE_MODULE
    from .legacy import legacy_storage_names, legacy_type_names

    if module == "torch.accelerator":  # the cpu rows; the npu target has patches of its own
        if attr in NPU_THROUGH_DEVICE_MODULE:
            return "through `torch.npu`, as `torch.cuda.*` (`cuda:N` names `npu:N`)"
        if attr == "is_available":
            return "torch_npu's accelerator, honouring `ASCEND_PATCH_CUDA_IS_AVAILABLE`"
        return "torch_npu's own accelerator (`npu`); a `cuda:N` given to it names `npu:N`"
    if "npu" not in backends:
        return "not patched: torch_npu's own behaviour"

    if module == "torch.cuda" and attr in legacy_type_names() + legacy_storage_names():
        return "the same adaptor, built on the current `npu:N`"
    if target == "torch:set_default_tensor_type":
        return "the same adaptor: `torch.cuda.*Tensor` -> `torch.npu.*Tensor` (torch_npu's legacy types)"
    if module == "torch.cuda" and not attr.startswith("_") and attr != "is_available":
        return f"`torch.npu.{attr}`, or raises UnsupportedOnTarget if torch_npu lacks it"
    if module == "torch.cuda.nvtx":
        return "profiler range (`torch.profiler.record_function`)"
    return "the same adaptor, onto `npu` / `npu:N`"


def _rows_not_in_the_cpu_table() -> list[tuple[str, str, str]]:
    """Entry points the cpu patch table cannot show: npu-only patches, environment variables, and
    ``torch.cuda.amp``, which works through the autocast / GradScaler / custom_fwd patches."""
    from ...environ import ENV_COUNTERPARTS
    from .backend_flags import FLAG_COUNTERPARTS

    rows = []
    for flag, (group, switch) in FLAG_COUNTERPARTS.items():
        rows.append((flag, "left alone: the host has neither TF32 nor HF32 (torch's own flag)",
                     f"reads and sets `torch.npu.{group}.{switch}` (torch_npu's HF32 switch; no patch if "
                     "torch_npu lacks it)"))
    cpu_env = {"CUDA_VISIBLE_DEVICES": "read: its entries are the virtual devices `torch.cuda.device_count()` "
                                       "presents"}
    for cuda_name, npu_name in ENV_COUNTERPARTS.items():
        rows.append((cuda_name, cpu_env.get(cuda_name, "ignored: the host has no CUDA runtime to configure"),
                     f"copied to `{npu_name}` before torch_npu is imported (a value already set wins; "
                     "`remove()` restores the environment)"))
    rows.append(("torch.cuda.amp.autocast / GradScaler / custom_fwd / custom_bwd",
                 "emulated: torch's wrappers call `torch.autocast('cuda')` / `GradScaler('cuda')` / "
                 "`torch.amp.custom_fwd(device_type='cuda')`, which are patched (float16 default kept)",
                 "the same adaptors, onto npu autocast"))
    return rows


def coverage_markdown(report: Report) -> str:
    groups: dict[str, list[str]] = defaultdict(list)
    rows: list[tuple[str, str, str, str]] = []
    for status in report.statuses:
        patch = status.patch
        if isinstance(patch, (EnvVar, ModuleShim)):
            continue
        if "translate device=" in patch.reason:
            groups["factory"].append(patch.shown_as)
            continue
        if isinstance(patch, Add) and status.detail == "already provided by the target":
            continue  # the thing it would add is there: nothing to cover
        action = patch.action.value
        cpu = f"{_CPU_ACTION.get(action, action)}: {patch.reason}"
        # deferred patches apply when their module is imported: the table covers what they do,
        # so it does not depend on what this process happened to import
        # so it does not depend on what this process happened to import; nor on the Megatron release
        if patch.needed:
            cpu += f" (needed on {patch.package} {patch.needed})"
        elif status.state not in ("applied", "deferred"):
            cpu = f"{status.state}: {status.detail}"
        npu = _npu_column(patch.target, patch.backends)
        if patch.package and "npu" in patch.backends:
            ranges = "; ".join(f"{what} {patch.package} {spec}" for what, spec in
                               (("checked against", patch.versions), ("needed on", patch.needed)) if spec)
            npu = f"the same patch ({ranges})"
        rows.append((patch.shown_as, cpu, npu))
    rows.extend(_rows_not_in_the_cpu_table())
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
