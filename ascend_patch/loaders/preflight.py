"""Preflight: every inconsistency found before any byte is written, each with numbers and a remedy."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..dtypes import FLOATING, SHORT_NAMES
from ..errors import AscendPatchError, Finding
from ..parallel import (
    CONVERT_FLAGS,
    divisors,
    format_choices,
    ParallelConfigError,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_layers,
    check_query_groups,
)

__all__ = [
    "PreflightError",
    "check_pipeline_split",
    "check_tensor_split",
    "check_expert_split",
    "check_vocab",
    "check_dtype",
    "check_tensors",
    "check_output_dir",
    "check_disk_space",
    "human_bytes",
    "raise_if_any",
]


# The checks are public functions returning :class:`Finding` lists so the converter can
# report all of them at once. Parallel sizes are judged by :mod:`ascend_patch.parallel` (the same
# rules ``ascend-patch check`` and training use), with the converter's flag names:
# ``28 layers cannot be split over 8 pipeline stages; use --target-pipeline-parallel-size
# 1, 2, 4, 7, 14 or 28, or give --num-layer-list``.
class PreflightError(AscendPatchError, ValueError):
    """The conversion cannot start; :attr:`problems` lists every reason."""

    def __init__(self, problems: Sequence[Finding]) -> None:
        self.problems = list(problems)
        lines = [f"  - {p}" for p in self.problems]
        super().__init__(f"conversion refused ({len(self.problems)} problem"
                         f"{'s' if len(self.problems) != 1 else ''}):\n" + "\n".join(lines))

    def codes(self) -> list[str]:
        return [p.code for p in self.problems]


def _problems(checks: Sequence[tuple[str, Callable[[], Any]]]) -> list[Finding]:
    """Run parallel-size checks (ascend_patch.parallel, shared with training), each failure a finding
    under the converter's code for it (a bad --num-layer-list keeps its own)."""
    problems = []
    for code, check in checks:
        try:
            check()
        except ParallelConfigError as exc:
            found = exc.finding
            problems.append(Finding(code if found.code != "layer-list" else "layer-list", found.message, found.remedy))
    return problems


def check_pipeline_split(num_layers: int, pp: int, vpp: int = 1,
                         num_layer_list: Sequence[int] | None = None) -> list[Finding]:
    """Layers against pipeline stages (and virtual chunks, or an explicit per-stage list)."""
    return _problems([("layers-vs-pp",
                       lambda: check_layers(num_layers, pp, vpp, num_layer_list or None, flags=CONVERT_FLAGS))])


def check_tensor_split(heads: int, groups: int, ffn: int, tp: int) -> list[Finding]:
    """Attention heads, query groups and the MLP width against the tensor-parallel size.

    The legacy checkpoint layout stores each rank's own KV heads, so KV heads are not
    replicated: TP must divide the query groups.
    """
    problems = _problems([
        ("heads-vs-tp", lambda: check_heads(heads, tp, flags=CONVERT_FLAGS)),
        ("groups-vs-tp", lambda: check_query_groups(groups, tp, allow_replication=False, flags=CONVERT_FLAGS)),
        ("ffn-vs-tp", lambda: check_ffn_hidden_size(ffn, tp, flags=CONVERT_FLAGS)),
    ])
    if problems:  # each message lists sizes for its own rule; say which satisfy all of them
        joint = divisors(math.gcd(math.gcd(heads, groups), ffn))
        first = problems[0]
        together = f"sizes that fit the heads, query groups and FFN together: {format_choices(joint)}"
        problems[0] = replace(first, remedy=f"{first.remedy}; {together}" if first.remedy else together)
    return problems


def check_expert_split(num_experts: int | None, expert_ffn: int | None, tp: int, ep: int, etp: int | None,
                       grouped_gemm: bool = False, naming: str = "local") -> list[Finding]:
    """Experts over EP ranks, each expert over expert-TP ranks, in the legacy layout's terms.

    Megatron-LM names a legacy rank file by its TP, PP and EP ranks (``mp_rank_TT_PPP_EEE``),
    so the expert-TP rank of a file's experts is its TP rank: expert-TP must equal TP.
    """
    family_flags = CONVERT_FLAGS
    if not num_experts:
        problems = []
        if ep != 1:
            problems.append(Finding("ep-dense", f"--target-expert-parallel-size {ep} was given but the model has no "
                                    "experts", "drop the flag (or use 1)"))
        if grouped_gemm:
            problems.append(Finding("ep-dense", "--moe-grouped-gemm was given but the model has no experts",
                                    "drop the flag"))
        return problems
    problems = _problems([("experts-vs-ep", lambda: check_experts(num_experts, ep, flags=family_flags))])
    expert_tp = tp if etp is None else etp
    if expert_tp != tp:
        problems.append(Finding("etp-vs-tp", f"expert tensor-parallel size {expert_tp} differs from TP {tp}: Megatron's "
                                "legacy layout names each rank file by TP rank (mp_rank_TT_PPP_EEE), so a file's "
                                "experts are split like its attention",
                                f"use --target-expert-tensor-parallel-size {tp} (or leave it out)"))
    if expert_ffn:
        problems += _problems([("expert-ffn-vs-tp", lambda: check_ffn_hidden_size(
            expert_ffn, expert_tp, flags=family_flags, what="each expert's FFN hidden size (moe_intermediate_size)"))])
    if grouped_gemm and naming == "local":
        from ..models.moe_map import GROUPED_MLP_REFUSAL

        problems.append(Finding("grouped-mlp", "--moe-grouped-gemm with the local spec asks for GroupedMLP",
                                GROUPED_MLP_REFUSAL))
    return problems


def check_vocab(vocab_size: int, divisor: int, tp: int, padded: int | None = None) -> list[Finding]:
    """The padding divisor, and a source's padded vocabulary against the true one."""
    problems = []
    if divisor < 1:
        problems.append(Finding("vocab-divisor", f"--make-vocab-size-divisible-by {divisor} must be >= 1",
                                "Megatron's default is 128"))
    if vocab_size < 1:
        problems.append(Finding("vocab-size", f"vocabulary size {vocab_size} must be >= 1"))
    if padded is not None and padded < vocab_size:
        problems.append(Finding("vocab-padded", f"the checkpoint's padded vocabulary {padded} is smaller than its "
                                f"vocabulary {vocab_size}", "pass the right --true-vocab-size"))
    return problems


DTYPE_CHOICES = (*SHORT_NAMES, *FLOATING)


def check_dtype(requested: str | None, source: str) -> list[Finding]:
    """``--params-dtype`` and the tensors' own dtype are ones the converter writes and reads."""
    problems = []
    if requested is not None and requested not in DTYPE_CHOICES:
        problems.append(Finding("dtype", f"--params-dtype {requested!r} is not a dtype the converter writes",
                                "use fp32, bf16 or fp16"))
    if source not in FLOATING:
        problems.append(Finding("dtype-source", f"the checkpoint's tensors are {source}, not a floating dtype the "
                                "converter handles", "convert them to fp32/bf16/fp16 first"))
    return problems


def check_tensors(expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], where: str,
                  ignorable: Iterable[str] = (), limit: int = 8) -> list[Finding]:
    """Missing, unexpected and mis-shaped tensors of a source checkpoint."""
    ignore = set(ignorable)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - ignore)
    wrong = sorted(k for k in set(expected) & set(found) if tuple(expected[k]) != tuple(found[k]))
    problems = []

    def show(keys: list[str]) -> str:
        head = ", ".join(keys[:limit])
        return head + (f" and {len(keys) - limit} more" if len(keys) > limit else "")

    if missing:
        problems.append(Finding("missing-tensors", f"{where} lacks {len(missing)} tensor(s) the model needs: "
                                f"{show(missing)}", "check --model-type-hf / the model config, or complete the "
                                "checkpoint"))
    if unexpected:
        problems.append(Finding("unexpected-tensors", f"{where} holds {len(unexpected)} tensor(s) the weight map does "
                                f"not know: {show(unexpected)}", "they would be dropped silently; check "
                                "--model-type-hf, or add them to the family's weights.py"))
    if wrong:
        details = [f"{k} {list(found[k])} (expected {list(expected[k])})" for k in wrong]
        problems.append(Finding("shape-mismatch", f"{where} has {len(wrong)} tensor(s) of the wrong shape: "
                                f"{show(details)}", "the config does not describe these weights"))
    return problems


def check_output_dir(save_dir: str, force: bool, load_dir: str | None = None) -> list[Finding]:
    """Everything about the destination that would fail after the work: checked before any.

    The output is assembled in a staging directory beside ``--save-dir`` and then moved
    into place (with --force: exchanged with the old directory), so the destination must
    be a real directory path (not a symbolic link, not a mount point) on a writable file
    system, not below a regular file; and never the source, inside it, or (with --force,
    which replaces it) around it.
    """
    problems = []
    save = os.path.abspath(save_dir)
    real = os.path.realpath(save_dir)
    if load_dir is not None:
        load = os.path.realpath(load_dir)
        if real == load or real.startswith(load + os.sep):
            problems.append(Finding("output-in-source", f"--save-dir {save_dir} is (inside) --load-dir {load_dir}",
                                    "choose a directory outside the source checkpoint"))
        elif load.startswith(real + os.sep) and force:
            problems.append(Finding("source-in-output", f"--load-dir {load_dir} is inside --save-dir {save_dir}, "
                                    "which --force replaces", "choose a --save-dir that does not hold the source"))
    if os.path.islink(save):
        problems.append(Finding("output-symlink", f"--save-dir {save_dir} is a symbolic link (to "
                                f"{os.readlink(save)}): the output directory is moved into place, which would "
                                "replace the link, not fill its target", f"give the real path, --save-dir {real}"))
    elif os.path.exists(save) and not os.path.isdir(save):
        problems.append(Finding("output-not-dir", f"--save-dir {save_dir} exists and is not a directory",
                                "choose a directory path"))
    elif os.path.isdir(save):
        cwd = os.path.realpath(os.getcwd())
        if cwd == real or cwd.startswith(real + os.sep):
            problems.append(Finding("output-is-cwd", f"--save-dir {save_dir} holds the current directory: the output "
                                    "replaces that directory with a new one, which would leave this shell in a "
                                    "deleted directory", "cd out of it first, or write into a new directory below "
                                    "it"))
        elif os.path.ismount(save):
            problems.append(Finding("output-mount-point", f"--save-dir {save_dir} is a mount point: the output is "
                                    "assembled beside it and moved into place, which cannot cross file systems",
                                    f"write into a directory inside it, e.g. --save-dir {os.path.join(save_dir, 'ckpt')}"))
        elif os.listdir(save) and not force:
            entries = sorted(os.listdir(save))
            problems.append(Finding("output-not-empty", f"--save-dir {save_dir} is not empty ({len(entries)} entries: "
                                    f"{', '.join(entries[:5])}{'...' if len(entries) > 5 else ''})",
                                    "pass --force to replace the checkpoint in it (other files are kept), or choose "
                                    "another directory"))
    problems += _check_writable_parent(save_dir, save)
    return problems


def _check_writable_parent(save_dir: str, save: str) -> list[Finding]:
    """The nearest existing ancestor of --save-dir is a directory this process can create entries in."""
    import errno
    import tempfile

    ancestor = os.path.dirname(save)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return [Finding("output-below-file", f"--save-dir {save_dir} is below {ancestor}, which is a "
                        f"{'regular file' if os.path.isfile(ancestor) else 'not a directory'}",
                        "choose a directory path")]
    try:
        name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    long = [p for p in os.path.relpath(save, ancestor).split(os.sep) if len(os.fsencode(p)) > name_max]
    if long:
        return [Finding("output-name-too-long", f"--save-dir {save_dir}: the name {long[0][:40]}... is "
                        f"{len(os.fsencode(long[0]))} bytes; the file system allows {name_max}",
                        "choose a shorter name")]
    try:
        read_only = bool(os.statvfs(ancestor).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): the probe below decides
        read_only = False
    if read_only:
        return [Finding("output-read-only", f"--save-dir {save_dir}: {ancestor} is on a read-only file system",
                        "choose a --save-dir on a writable file system")]
    try:  # the staging directory goes here: create (and remove) one now rather than fail after the work
        os.rmdir(tempfile.mkdtemp(prefix=".ascend_patch-probe-", dir=ancestor))
    except OSError as exc:
        why = "it is on a read-only file system" if exc.errno == errno.EROFS else exc.strerror or str(exc)
        return [Finding("output-not-writable", f"--save-dir {save_dir}: cannot create directories in {ancestor} "
                        f"({why})", "choose a --save-dir where you can write, or fix its permissions")]
    return []


def check_disk_space(save_dir: str, needed: int) -> list[Finding]:
    """Enough free space where the output goes (the staging directory sits next to it)."""
    probe = os.path.realpath(save_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < needed:
        return [Finding("disk-space", f"the output needs {human_bytes(needed)} but {probe} has {human_bytes(free)} free",
                        "free space or choose another --save-dir")]
    return []


def human_bytes(n: int | float) -> str:
    """``n`` bytes in the decimal unit that fits (``512 bytes``, ``3.4 KB``, ``12.0 MB``, ``14.20 GB``, ``1.50 TB``),
    so a small output reads as what it is rather than ``0.00 GB``."""
    if n < 1000:
        return f"{int(n)} byte{'' if int(n) == 1 else 's'}"
    for unit, size, digits in (("KB", 1e3, 1), ("MB", 1e6, 1), ("GB", 1e9, 2)):
        if n < size * 1000:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n / 1e12:.2f} TB"


def raise_if_any(problems: Iterable[Finding]) -> None:
    found = list(problems)
    if found:
        raise PreflightError(found)
