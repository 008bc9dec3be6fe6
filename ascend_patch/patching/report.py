"""The migration report: the patch table and the CUDA APIs the program used."""

from __future__ import annotations

import atexit
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from ..backend import Backend
from ..config import Settings
from ..patch import ModuleShim
from ..shim import ShimBuilder, ShimTable, is_shim, table_rows
from ..usage import ApiUse
from .manager import PatchManager, PatchStatus, manager
from .versions import versions_seen

__all__ = ["Report", "apply_and_report", "build_report", "print_at_exit", "process_label", "set_process_label"]


def _table(headers: list[str], rows: list[list[str]], limits: dict[int, int] | None = None) -> str:
    limits = limits or {}
    clipped = [[(c if len(c) <= limits.get(i, 10**6) else c[: limits[i] - 1] + "…") for i, c in enumerate(r)]
               for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in clipped]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in clipped]
    return "\n".join([line.rstrip(), rule, *body])


@dataclass
class Report:
    """A snapshot of the patch manager's state and the recorded API uses.

    ``ascend_patch.report()`` returns one; ``str(report)`` is the table. With
    ``ASCEND_PATCH_REPORT=1`` it is printed at exit on rank 0 (``all``: on every rank).
    """

    target: str | None
    reason: str
    active: bool
    statuses: list[PatchStatus] = field(default_factory=list)
    uses: list[ApiUse] = field(default_factory=list)
    reporting: bool = False
    plugin_failures: list[str] = field(default_factory=list)
    cuda_is_available: bool = True
    devices: str = ""  # cpu target: how many virtual devices this process sees, and why
    packages: dict[str, str] = field(default_factory=dict)  # package -> version, where it was read (version gate)

    def counts(self) -> dict[str, int]:
        return dict(Counter(s.state for s in self.statuses))

    def rows(self, state: str | None = None) -> list[PatchStatus]:
        return [s for s in self.statuses if state is None or s.state == state]

    def patch_table(self, include_applied: bool = True) -> str:
        rows = []
        for s in self.statuses:
            if s.state == "applied" and not include_applied:
                continue
            detail = s.detail
            if s.rebound:
                more = f" (+{len(s.rebound) - 3} more)" if len(s.rebound) > 3 else ""
                detail = (detail + "; " if detail else "") + "re-bound in " + ", ".join(s.rebound[:3]) + more
            rows.append([s.patch.shown_as, s.state, s.patch.action.value, s.patch.owner, detail or s.patch.reason])
        return _table(["patch", "state", "action", "plugin", "detail"], rows, {0: 60, 4: 90})

    def usage_table(self) -> str:
        if not self.reporting:
            return "CUDA API use was not recorded (set ASCEND_PATCH_REPORT=1 or pass --report)."
        if not self.uses:
            return "The program called no CUDA API."
        rows = [[u.api, str(u.calls), u.action, u.first_site] for u in self.uses]
        table = _table(["CUDA API", "calls", "done", "first call site"], rows, {0: 60})
        fallback = self.cpu_fallback()
        return table + ("\n\n" + fallback if fallback else "")

    def cpu_fallback(self) -> str:
        """A warning when the program asked for a GPU and then placed nothing on one (it took its CPU path)."""
        probes = [u for u in self.uses if u.api in _PROBES]
        if not probes or any(u.action == "translated" for u in self.uses):
            return ""
        asked = ", ".join(f"{u.api} at {u.first_site}" for u in probes)
        if not self.cuda_is_available:
            return (f"CPU fallback: the program asked for a GPU ({asked}), was told there is none "
                    "(ASCEND_PATCH_CUDA_IS_AVAILABLE=0) and placed nothing on a CUDA device: it ran its CPU "
                    "path. Unset ASCEND_PATCH_CUDA_IS_AVAILABLE (or set it to 1) to run its CUDA path on "
                    f"the {self.target} target.")
        return (f"CPU fallback: the program asked for a GPU ({asked}) but placed nothing on a CUDA device: "
                "it most likely took its CPU path. Check how it picks its device (a --cpu/--no-cuda flag, "
                "torch.backends.mps, an environment variable) or run it with --report all.")

    def shim_tables(self) -> dict[str, ShimTable]:
        """Each shimmed package's declaration (top-level name -> table), from this apply's shim patches."""
        tables: dict[str, ShimTable] = {}
        for status in self.statuses:
            patch = status.patch
            if isinstance(patch, ModuleShim) and isinstance(patch.make, ShimBuilder):
                tables.setdefault(patch.target.split(".")[0], patch.make.table)
        return tables

    def shim_table(self) -> str:
        """Per shim module: each name it provides and what that maps to; served now, or the real package used."""
        state = {s.patch.target: _shim_state(s) for s in self.statuses if isinstance(s.patch, ModuleShim)}
        rows = [[module, name, target, state.get(module, "")] for table in self.shim_tables().values()
                for module, name, target in table_rows(table)]
        declared = {row[0] for row in rows}
        rows += [[name, "", "(no table declared)", shown] for name, shown in state.items() if name not in declared]
        return _table(["shim module", "name", "maps to", "state"], rows, {2: 120})

    def summary(self) -> str:
        if self.target is None:
            return f"ascend_patch: not active ({self.reason})"
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts().items()))
        seen = "".join(f"\n  {name} {where}" for name, where in sorted(self.packages.items())
                       if where.split(" ", 1)[1:] != ["(installed distribution)"])
        line = f"ascend_patch: target {self.target} ({self.reason}); patches: {counts}"
        return line + (f"\n{self.devices}" if self.devices else "") + (f"\nchecked against:{seen}" if seen else "")

    def __str__(self) -> str:
        parts = [self.summary(), "", self.patch_table()]
        if self.plugin_failures:
            parts += ["", "Plugin failures:", *("  " + f for f in self.plugin_failures)]
        if self.reporting:
            parts += ["", self.usage_table()]
        return "\n".join(parts)


def _shim_state(status: PatchStatus) -> str:
    name = status.patch.target
    if status.state == "applied":
        shown = "imported now" if is_shim(sys.modules.get(name)) else "served on import"
        hidden = getattr(status.patch, "hidden_from", ())
        more = f" and {len(hidden) - 1} more" if len(hidden) > 1 else ""
        return shown + (f" (not to {hidden[0]}{more})" if hidden else "")
    if status.state == "skipped" and "installed" in status.detail:
        return "real package installed"
    return status.state


def build_report(manager: PatchManager) -> Report:
    selection = manager.selection
    recorder = manager.recorder
    target = manager.backend.name if manager.backend is not None else None
    return Report(
        target=target,
        reason=selection.reason if selection is not None else "apply() was not called",
        active=manager.active,
        statuses=list(manager.statuses),
        uses=recorder.uses() if recorder is not None else [],
        reporting=recorder is not None,
        plugin_failures=list(manager.plugin_failures),
        cuda_is_available=manager.settings.cuda_is_available if manager.settings is not None else True,
        devices=_devices(target),
        packages={name: f"{found.version} ({found.origin})" for name, found in versions_seen().items()},
    )


def _devices(target: str | None) -> str:
    if target != "cpu":
        return ""
    from ..cpu_host import CPU_DEVICES, device_source

    count, why = device_source()
    hint = f"; {CPU_DEVICES}=N presents N" if why.startswith("the default") else ""
    return f"virtual devices: {count} ({why}{hint})"


# the questions a program asks before it picks its device
_PROBES = frozenset({"torch.cuda.is_available", "torch.cuda.device_count", "torch.accelerator.is_available",
                     "torch.accelerator.current_accelerator", "torch.accelerator.device_count"})

_registered = False
_label: str | None = None


def process_label() -> str:
    """How this process names itself in the report: its rank, or its place in an mp.spawn job."""
    if _label is not None:
        return _label
    return f"rank {os.environ.get('RANK', '0')}"


def set_process_label(label: str) -> None:
    """Name this process in the report (``torch.multiprocessing.spawn``'s children and parent)."""
    global _label
    _label = label


def _prints(every_rank: bool) -> bool:
    if every_rank:
        return True
    if _label is not None and _label.startswith("mp.spawn process "):
        return _label.startswith("mp.spawn process 0 ")
    return os.environ.get("RANK", "0") == "0"


def print_at_exit(manager: PatchManager, every_rank: bool, stream: TextIO | None = None) -> None:
    """Print the CUDA API table (and a one-line patch summary) when the process exits."""
    global _registered
    if _registered:
        return
    _registered = True

    def emit() -> None:
        if manager.recorder is None or not _prints(every_rank):
            return  # reporting was switched off by a later apply(), or another rank prints it
        report = build_report(manager)
        out = stream or sys.stderr
        sys.stdout.flush()
        header = f"=== ascend_patch migration report ({process_label()}, pid {os.getpid()}) ==="
        print("\n".join([header, report.summary(), "", report.usage_table(), ""]), file=out, flush=True)

    atexit.register(emit)


def apply_and_report(settings: Settings | None = None, backend: Backend | None = None) -> Report:
    """Apply the process's patch set (see ``ascend_patch.apply``) and arrange the report at exit."""
    manager.apply(settings, backend)
    if manager.active and manager.settings is not None and manager.settings.report_enabled:
        print_at_exit(manager, every_rank=manager.settings.report == "all")
    return build_report(manager)
