"""Preflight: every inconsistency found before any byte is written, each with numbers and a remedy.

The checks are public functions returning :class:`Problem` lists so the converter can
report all of them at once (and so ``comm/topology.py`` can share them later):
``28 layers cannot be split over 8 pipeline stages; valid sizes: 1, 2, 4, 7, 14, 28,
or pass --num-layer-list``.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Problem",
    "PreflightError",
    "divisors",
    "valid_pipeline_sizes",
    "valid_tensor_sizes",
    "check_pipeline_split",
    "check_tensor_split",
    "check_vocab",
    "check_dtype",
    "check_tensors",
    "check_output_dir",
    "check_disk_space",
    "raise_if_any",
]


@dataclass(frozen=True)
class Problem:
    """One finding: a stable ``code`` (tests, scripts), what is wrong, and what to do."""

    code: str
    message: str
    remedy: str = ""

    def __str__(self) -> str:
        return f"{self.message}; {self.remedy}" if self.remedy else self.message


class PreflightError(ValueError):
    """The conversion cannot start; :attr:`problems` lists every reason."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = [f"  - {p}" for p in self.problems]
        super().__init__(f"conversion refused ({len(self.problems)} problem"
                         f"{'s' if len(self.problems) != 1 else ''}):\n" + "\n".join(lines))

    def codes(self) -> list[str]:
        return [p.code for p in self.problems]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def _join(sizes: Iterable[int]) -> str:
    items = [str(s) for s in sizes]
    return ", ".join(items[:-1]) + (" or " if len(items) > 1 else "") + items[-1] if items else "none"


def valid_pipeline_sizes(num_layers: int, vpp: int = 1) -> list[int]:
    """Pipeline sizes that split ``num_layers`` evenly (into ``vpp`` chunks per stage)."""
    return [p for p in divisors(num_layers) if num_layers % (p * vpp) == 0]


def valid_tensor_sizes(heads: int, groups: int, ffn: int | None = None) -> list[int]:
    """TP sizes megatron-core 0.16 accepts: dividing the heads, the query groups (and the MLP)."""
    g = math.gcd(heads, groups)
    if ffn:
        g = math.gcd(g, ffn)
    return divisors(g)


def check_pipeline_split(num_layers: int, pp: int, vpp: int = 1,
                         num_layer_list: Sequence[int] | None = None) -> list[Problem]:
    """Layers against pipeline stages (and virtual chunks, or an explicit per-stage list)."""
    if pp < 1 or vpp < 1:
        return [Problem("pp-size", f"pipeline size {pp} and virtual pipeline size {vpp} must be >= 1")]
    if num_layer_list:
        counts = list(num_layer_list)
        problems = []
        if vpp > 1:
            problems.append(Problem("layer-list-vpp", "--num-layer-list cannot be combined with a virtual "
                                    f"pipeline size of {vpp}", "drop one of them"))
        if len(counts) != pp:
            problems.append(Problem("layer-list-length", f"--num-layer-list {','.join(map(str, counts))} has "
                                    f"{len(counts)} entries for {pp} pipeline stages", f"give {pp} counts"))
        if sum(counts) != num_layers or (counts and min(counts) < 1):
            problems.append(Problem("layer-list-sum", f"--num-layer-list {','.join(map(str, counts))} sums to "
                                    f"{sum(counts)} but the model has {num_layers} layers",
                                    f"give {len(counts)} positive counts summing to {num_layers}"))
        return problems
    if num_layers % (pp * vpp) == 0:
        return []
    if vpp > 1:
        sizes = valid_pipeline_sizes(num_layers, vpp)
        return [Problem("layers-vs-pp", f"{num_layers} layers cannot be split over {pp} pipeline stages x {vpp} "
                        "virtual chunks", f"valid pipeline sizes with {vpp} chunks: {_join(sizes)}; or change "
                        "--virtual-pipeline-parallel-size")]
    return [Problem("layers-vs-pp", f"{num_layers} layers cannot be split over {pp} pipeline stages",
                    f"valid sizes: {_join(valid_pipeline_sizes(num_layers))}, or pass --num-layer-list")]


def check_tensor_split(heads: int, groups: int, ffn: int, tp: int) -> list[Problem]:
    """Attention heads, query groups and the MLP width against the tensor-parallel size."""
    if tp < 1:
        return [Problem("tp-size", f"tensor-parallel size {tp} must be >= 1")]
    valid = _join(valid_tensor_sizes(heads, groups, ffn))
    problems = []
    if heads % tp:
        problems.append(Problem("heads-vs-tp", f"{heads} attention heads cannot be split over {tp} tensor-parallel "
                                "ranks", f"valid sizes: {valid}"))
    if groups % tp:
        extra = " (megatron-core 0.16 needs num_query_groups % TP == 0; replicating KV heads is not done)" \
            if groups < tp else ""
        problems.append(Problem("groups-vs-tp", f"{groups} query groups (key/value heads) cannot be split over {tp} "
                                f"tensor-parallel ranks{extra}", f"valid sizes: {valid}"))
    if ffn % tp:
        problems.append(Problem("ffn-vs-tp", f"ffn_hidden_size {ffn} cannot be split over {tp} tensor-parallel ranks",
                                f"valid sizes: {valid}"))
    return problems


def check_vocab(vocab_size: int, divisor: int, tp: int, padded: int | None = None) -> list[Problem]:
    """The padding divisor, and a source's padded vocabulary against the true one."""
    problems = []
    if divisor < 1:
        problems.append(Problem("vocab-divisor", f"--make-vocab-size-divisible-by {divisor} must be >= 1",
                                "Megatron's default is 128"))
    if vocab_size < 1:
        problems.append(Problem("vocab-size", f"vocabulary size {vocab_size} must be >= 1"))
    if padded is not None and padded < vocab_size:
        problems.append(Problem("vocab-padded", f"the checkpoint's padded vocabulary {padded} is smaller than its "
                                f"vocabulary {vocab_size}", "pass the right --true-vocab-size"))
    return problems


DTYPE_CHOICES = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16")


def check_dtype(requested: str | None, source: str, declared: str | None = None) -> list[Problem]:
    """``--params-dtype`` and the config's declared dtype against what the tensors are."""
    problems = []
    if requested is not None and requested not in DTYPE_CHOICES:
        problems.append(Problem("dtype", f"--params-dtype {requested!r} is not a dtype the converter writes",
                                "use fp32, bf16 or fp16"))
    if source not in ("float32", "bfloat16", "float16"):
        problems.append(Problem("dtype-source", f"the checkpoint's tensors are {source}, not a floating dtype the "
                                "converter handles", "convert them to fp32/bf16/fp16 first"))
    return problems


def check_tensors(expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], where: str,
                  ignorable: Iterable[str] = (), limit: int = 8) -> list[Problem]:
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
        problems.append(Problem("missing-tensors", f"{where} lacks {len(missing)} tensor(s) the model needs: "
                                f"{show(missing)}", "check --model-type-hf / the model config, or complete the "
                                "checkpoint"))
    if unexpected:
        problems.append(Problem("unexpected-tensors", f"{where} holds {len(unexpected)} tensor(s) the weight map does "
                                f"not know: {show(unexpected)}", "they would be dropped silently; check "
                                "--model-type-hf, or add them to the family's weights.py"))
    if wrong:
        details = [f"{k} {list(found[k])} (expected {list(expected[k])})" for k in wrong]
        problems.append(Problem("shape-mismatch", f"{where} has {len(wrong)} tensor(s) of the wrong shape: "
                                f"{show(details)}", "the config does not describe these weights"))
    return problems


def check_output_dir(save_dir: str, force: bool, load_dir: str | None = None) -> list[Problem]:
    """A non-empty output directory needs --force; never write into the source."""
    problems = []
    save = os.path.realpath(save_dir)
    if load_dir is not None:
        load = os.path.realpath(load_dir)
        if save == load or save.startswith(load + os.sep):
            problems.append(Problem("output-in-source", f"--save-dir {save_dir} is (inside) --load-dir {load_dir}",
                                    "choose a directory outside the source checkpoint"))
    if os.path.exists(save) and not os.path.isdir(save):
        problems.append(Problem("output-not-dir", f"--save-dir {save_dir} exists and is not a directory"))
    elif os.path.isdir(save) and os.listdir(save) and not force:
        entries = sorted(os.listdir(save))
        problems.append(Problem("output-not-empty", f"--save-dir {save_dir} is not empty ({len(entries)} entries: "
                                f"{', '.join(entries[:5])}{'...' if len(entries) > 5 else ''})",
                                "pass --force to replace what the conversion writes, or choose another directory"))
    return problems


def check_disk_space(save_dir: str, needed: int) -> list[Problem]:
    """Enough free space where the output goes (the staging directory sits next to it)."""
    probe = os.path.realpath(save_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < needed:
        return [Problem("disk-space", f"the output needs {needed / 1e9:.2f} GB but {probe} has {free / 1e9:.2f} GB free",
                        "free space or choose another --save-dir")]
    return []


def raise_if_any(problems: Iterable[Problem]) -> None:
    found = list(problems)
    if found:
        raise PreflightError(found)
