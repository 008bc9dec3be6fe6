"""The convert engine: resolve, preflight, compose, stream, commit atomically, verify."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import itemsize
from ..errors import AscendPatchError, Finding, FindingError
from ..models.registry import get_spec_registry
from ..models.weightmap import Piece, TensorPlan, compose, is_padding
from ..parallel import LayoutError
from .blocks import BlockFiller, raw_dtype, row_blocks
from .formats import ConvertOptions, SourceCheckpoint, TargetFile, TargetPlan, get_format_registry
from .parallel_write import default_workers, write_groups
from .preflight import PreflightError, check_disk_space, check_dtype, check_output_dir
from .publish import STAGING_PREFIX, publish, remove_stale_staging
from .torch_zip import PAGE, CrcCache

__all__ = ["convert", "prepare", "ConversionResult", "Interrupted", "BLOCK_BYTES", "Progress"]

BLOCK_BYTES = 32 * 1024 * 1024

# on_progress(event, info): events "start" (total bytes), "tensor" (file, key, bytes), "file" (relpath)
Progress = Callable[[str, dict[str, Any]], None]


class Interrupted(AscendPatchError, RuntimeError):
    """The conversion was stopped by a signal; the staging directory was removed."""


@dataclass
class ConversionResult:
    """What a conversion did (the ``verify`` entry is filled when ``--verify`` ran)."""

    source: SourceCheckpoint
    plan: TargetPlan
    save_dir: str
    bytes_written: int = 0
    seconds: float = 0.0  # the whole conversion: opening the source and preflight to publishing (not --verify)
    files: list[str] = field(default_factory=list)
    verify: Any = None
    kept: list[str] = field(default_factory=list)  # entries of the old --save-dir that were not checkpoint files
    phases: dict[str, float] = field(default_factory=dict)  # prepare, streaming, fsync (summed over workers), publish

    def summary(self) -> str:
        data, small = len(self.plan.files), len(self.plan.side_files) + len(self.plan.commit_files)
        streaming = self.phases.get("streaming", 0.0)
        rate = self.bytes_written / streaming / 1e6 if streaming else 0.0
        times = ", ".join(f"{name} {self.phases[name]:.2f} s" for name in ("prepare", "streaming", "fsync", "publish")
                          if name in self.phases)
        lines = [f"source: {self.source.describe()}", f"target: {self.plan.description}",
                 f"wrote {data} data file{'s' if data != 1 else ''} ({self.bytes_written / 1e6:.1f} MB) and {small} "
                 f"small file{'s' if small != 1 else ''} to {self.save_dir} in {self.seconds:.2f} s ({times}; "
                 f"streaming {rate:.0f} MB/s)"]
        lines += [f"note: {n}" for n in self.source.notes + self.plan.notes]
        if self.kept:
            lines.append(f"note: replaced the checkpoint in {self.save_dir}; kept {len(self.kept)} entr"
                         f"{'y' if len(self.kept) == 1 else 'ies'} that belong to no checkpoint: "
                         f"{', '.join(self.kept[:8])}{' ...' if len(self.kept) > 8 else ''}")
        if self.verify is not None:
            lines.append(self.verify.summary())
        return "\n".join(lines)


def prepare(load_dir: str, save_dir: str | None, loader: str, saver: str,
            options: ConvertOptions) -> tuple[SourceCheckpoint, TargetPlan]:
    """Open the source, plan the target, compose, and preflight; raises PreflightError listing every problem."""
    registry = get_format_registry()
    loader_obj = registry.loader(loader)
    saver_obj = registry.saver(saver)
    implied = get_spec_registry().for_format_name(loader)  # --loader qwen3_hf: the qwen3 family
    if implied is not None and options.family_hint is None:
        options = dataclasses.replace(options, family_hint=implied.name)
    problems: list[Finding] = []
    if save_dir is not None:
        problems += check_output_dir(save_dir, options.force, load_dir)
    source = loader_obj.open(load_dir, options)
    problems += source.problems
    problems += check_dtype(options.params_dtype, source.dtype)
    for flag, claimed in options.claimed.items():
        actual = getattr(source.config, flag)
        if claimed and not actual:
            problems.append(Finding("flag-vs-config", f"--{flag.replace('_', '-')} was given but the {source.config.family} "
                                    f"config of {load_dir} has {flag}=False", "drop the flag or fix the config"))
    plan = saver_obj.plan(source, options)
    problems += plan.problems + _vocab_problems(source, plan)
    if not problems:
        try:
            for f in plan.files:
                f.tensors = [compose(t, source.canonical) for t in f.tensors]
        except LayoutError as exc:
            problems.append(Finding("compose", str(exc)))
        plan.notes += _padding_notes(source, plan)
    if save_dir is not None and not problems:
        problems += check_disk_space(save_dir, plan.nbytes + sum(map(len, plan.side_files.values())))
    if problems:
        raise PreflightError(problems)
    return source, plan


def _vocab_problems(source: SourceCheckpoint, plan: TargetPlan) -> list[Finding]:
    """A padded source whose true vocabulary is unknown cannot go to a target without padding (Hugging Face):
    which of its rows are tokens and which are Megatron's padding is exactly what is unknown."""
    if plan.padded_vocab is not None or source.padded_vocab is None or source.vocab_unknown is None:
        return []
    return [Finding("vocab-unknown", f"the true vocabulary of {source.path} is unknown ({source.vocab_unknown}): its "
                    f"{source.padded_vocab} embedding rows include Megatron's padding, which a checkpoint without "
                    "padding must not hold", "pass --true-vocab-size N, the tokenizer's vocabulary (len(tokenizer); "
                    "config.json's vocab_size of the model it was trained from)")]


def _padding_notes(source: SourceCheckpoint, plan: TargetPlan) -> list[str]:
    """What the conversion did with a Megatron source's vocabulary padding rows (Megatron-LM trains them)."""
    if source.padded_vocab is None or plan.padded_vocab is None and source.vocab_unknown is not None:
        return []
    vocab = source.config.vocab_size
    if plan.padded_vocab is None:  # a target without padding (HF): the true vocabulary only
        cut = source.padded_vocab - vocab
        return [f"wrote the {vocab} rows of the true vocabulary ({source.vocab_from}) and dropped the source's {cut} "
                f"vocabulary padding row{'s' if cut != 1 else ''} after them (padded vocabulary {source.padded_vocab}), "
                "which belong to no token"] if cut > 0 else []
    if not any(map(is_padding, source.canonical)):
        return []
    have, need = source.padded_vocab - vocab, plan.padded_vocab - vocab
    kept = f"the source's {have} vocabulary padding rows (after the {vocab} real ones)"
    if need > have:
        return [f"{kept} are kept; the target's padded vocabulary {plan.padded_vocab} (for its TP) adds {need - have} "
                "new padding rows, written as zeros"]
    if need < have:
        return [f"the target's padded vocabulary {plan.padded_vocab} (for its TP) keeps the first {need} of {kept}; "
                f"the last {have - need}, which belong to no token, are dropped"]
    return [f"{kept} are kept unchanged"]


# 1. The loader describes the source (headers only); the saver plans the target in
#    canonical (HF) terms; every target tensor is composed onto source bytes.
# 2. Preflight collects every problem (model vs layout, source tensors, dtype, output
#    directory, disk space) and refuses with all of them before any work.
# 3. Each output file is written into a staging directory next to ``--save-dir``, block
#    by block (bounded memory), by worker threads (:mod:`.parallel_write`); side files
#    follow, the tracker / ``config.json`` last;
#    only then is the staging directory moved into place. An interrupted run leaves no
#    output that looks valid (SIGTERM and Ctrl-C also remove the staging directory).
def convert(load_dir: str, save_dir: str, loader: str = "hf", saver: str = "mg",
            options: ConvertOptions | None = None, on_progress: Progress | None = None) -> ConversionResult:
    """Convert the checkpoint at ``load_dir`` into ``save_dir`` (the steps are in the comment above)."""
    start = time.perf_counter()
    options = options or ConvertOptions()
    source, plan = prepare(load_dir, save_dir, loader, saver, options)
    result = ConversionResult(source, plan, save_dir)
    result.phases["prepare"] = time.perf_counter() - start
    parent = os.path.dirname(os.path.abspath(save_dir))
    os.makedirs(parent, exist_ok=True)
    remove_stale_staging(parent)
    staging = os.path.join(parent, f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(staging)
    with _signals_raise():
        try:
            synced = _Fsync(staging)
            began = time.perf_counter()
            result.bytes_written = _write_all(source, plan, staging, options, on_progress, synced.file)
            for rel, data in {**plan.side_files, **plan.commit_files}.items():
                _write_small(os.path.join(staging, rel), data)
                synced.file(rel)
            synced.directories()  # the entries too: a power loss must not leave a published folder of empty names
            result.phases["streaming"] = time.perf_counter() - began - synced.seconds_here
            result.phases["fsync"] = synced.seconds
            result.files = [f.relpath for f in plan.files] + list(plan.side_files) + list(plan.commit_files)
            began = time.perf_counter()
            result.kept = publish(staging, save_dir, plan, options.force)
            _fsync_dir(os.path.dirname(os.path.abspath(save_dir)))  # the rename itself
            result.phases["publish"] = time.perf_counter() - began
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    result.seconds = time.perf_counter() - start
    if options.verify:
        from .verify import verify

        saver_obj = get_format_registry().saver(saver)
        result.verify = verify(save_dir, source=source, loader=saver_obj.loader or saver, options=options)
    return result


class _Fsync:
    """fsync of every file written into the staging directory, and of its directories, before it is published.

    Data files are synced by the worker that closed them (``write_groups``' ``finished``), while
    the other goes on writing; ``seconds`` is the time spent in fsync, summed over threads, and
    ``seconds_here`` the part the calling thread waited for.
    """

    def __init__(self, staging: str) -> None:
        self.staging = staging
        self.seconds = self.seconds_here = 0.0
        self._lock = threading.Lock()

    def file(self, target: TargetFile | str) -> None:
        rel = target if isinstance(target, str) else target.relpath
        began = time.perf_counter()
        fd = os.open(os.path.join(self.staging, rel), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._add(time.perf_counter() - began)

    def directories(self) -> None:
        began = time.perf_counter()
        for here, _, _ in os.walk(self.staging):
            _fsync_dir(here)
        self._add(time.perf_counter() - began)

    def _add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            if threading.current_thread() is threading.main_thread():
                self.seconds_here += seconds


def _fsync_dir(path: str) -> None:
    """A directory's entries to disk (where the platform can open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync directories
        pass
    finally:
        os.close(fd)


def _write_all(source: SourceCheckpoint, plan: TargetPlan, staging: str, options: ConvertOptions,
               on_progress: Progress | None, finished: Callable[[TargetFile], None] | None = None) -> int:
    total = plan.nbytes
    bar = _progress_bar(total, options)
    if on_progress:
        on_progress("start", {"total": total})
    written = 0
    crc_cache = CrcCache()  # one conversion's: replicated tensors' source ranges are read once for their CRC

    def open_writer(target: TargetFile, filler: BlockFiller) -> Any:
        path = os.path.join(staging, target.relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return _open_writer(target, path, options, _page_offsets(filler, target), crc_cache)

    def on_event(event: tuple[Any, ...]) -> None:
        nonlocal written
        kind = event[0]
        if kind == "bytes":
            if bar is not None:
                bar.update(event[1])
        elif kind == "tensor":
            written += event[3]
            if on_progress:
                on_progress("tensor", {"file": event[1], "key": event[2], "written": written})
        elif kind == "written":
            written += event[1]
        elif kind == "file" and on_progress:
            on_progress("file", {"file": event[1], "written": written})

    try:
        write_groups(_lockstep_groups(plan.files), source.tensors, options.workers or default_workers(),
                     open_writer, _write_tensor, BLOCK_BYTES, on_event,
                     fine_events=bar is not None or on_progress is not None, finished=finished)
    finally:
        if bar is not None:
            bar.close()
    return written


def _lockstep_groups(files: list[TargetFile]) -> list[list[TargetFile]]:
    """Consecutive files with the same tensor layout (the TP ranks of one stage) are written together,
    tensor by tensor, so each source block read serves all of them."""
    groups: list[list[TargetFile]] = []
    for f in files:
        g = groups[-1] if groups else None
        if g and g[0].format == f.format and g[0].dtype == f.dtype and len(g[0].tensors) == len(f.tensors) and all(
                a.shape == b.shape for a, b in zip(g[0].tensors, f.tensors)) and len(g) < 8:
            g.append(f)
        else:
            groups.append([f])
    return groups


def _write_tensor(filler: BlockFiller, writers: list[Any], tensors: list[TensorPlan], dtype: str, buffer: np.ndarray,
                  advance: Callable[[int], None]) -> list[int]:
    """One tensor of every file of a lockstep group (same shape); returns the bytes written to each.

    Whole rows in the same dtype go file to file. The rest is filled block by block, every
    file's block before the next block, so a source block several files read (a row-parallel
    weight's rows, a replicated tensor) is read once and kept only until its last reader took it.
    """
    done = [0] * len(tensors)
    blocked = []
    for k, (writer, tensor) in enumerate(zip(writers, tensors)):
        if not tensor.shape:
            tensor = tensors[k] = TensorPlan(tensor.key, (1,), tuple(Piece(p.src, (0,), (0,), (1,)) for p in tensor.pieces))
        direct = filler.direct(tensor, dtype)
        if direct is None:
            blocked.append(k)
            continue
        row_bytes = itemsize(dtype) * math.prod(tensor.shape[1:])
        for piece, info in direct:  # whole rows, same dtype: file to file, never through this process
            nbytes = piece.size[0] * row_bytes
            dst = piece.dst_start[0] * row_bytes
            if info is None:
                _write_zeros(writer, tensor.key, dst, nbytes, buffer)
            else:
                writer.copy(tensor.key, dst, filler.files.fd(info.path), info.offset + piece.src_start[0] * row_bytes,
                            nbytes)
            done[k] += nbytes
            advance(nbytes)
    if not blocked:
        return done
    shape = tensors[blocked[0]].shape
    row_bytes = itemsize(dtype) * math.prod(shape[1:])
    for start, stop in row_blocks(shape[0], row_bytes, BLOCK_BYTES):
        nbytes = (stop - start) * row_bytes
        filler.expect([tensors[k] for k in blocked], start, stop)
        for k in blocked:
            raw = buffer[:nbytes] if nbytes <= buffer.size else np.empty(nbytes, dtype=np.uint8)
            out = raw.view(raw_dtype(dtype)).reshape(stop - start, *shape[1:])
            filler.fill(tensors[k], start, stop, out, dtype)
            writers[k].write(tensors[k].key, start * row_bytes, memoryview(raw))
            done[k] += nbytes
            advance(nbytes)
    filler.expect([], 0, 0)
    return done


def _write_zeros(writer: Any, key: str, offset: int, nbytes: int, buffer: np.ndarray) -> None:
    zeros = buffer[: min(nbytes, buffer.size)]
    zeros[...] = 0
    done = 0
    while done < nbytes:
        n = min(zeros.size, nbytes - done)
        writer.write(key, offset + done, memoryview(zeros[:n]))
        done += n


def _page_offsets(filler: BlockFiller, target: TargetFile) -> dict[str, int]:
    """Key -> where in a page each tensor's largest file-to-file piece starts in its source file.

    A torch-format output places each tensor so that piece lands at the same offset within
    a page: the kernel then copies page onto page instead of splitting every page in two
    (measured 1.5x faster for ``copy_file_range`` on ext4).
    """
    out = {}
    for tensor in target.tensors:
        direct = filler.direct(tensor, target.dtype) if tensor.shape else None
        if not direct:
            continue
        row_bytes = itemsize(target.dtype) * math.prod(tensor.shape[1:])
        piece, info = max(direct, key=lambda d: d[0].size[0])
        if info is not None:
            out[tensor.key] = (info.offset + (piece.src_start[0] - piece.dst_start[0]) * row_bytes) % PAGE
    return out


def _open_writer(target: TargetFile, path: str, options: ConvertOptions, page_offsets: dict[str, int],
                 crc_cache: CrcCache | None = None) -> Any:
    if target.format == "safetensors":
        from .safetensors_io import SafetensorsWriter

        return SafetensorsWriter(path, [(t.key, t.shape, target.dtype) for t in target.tensors], target.metadata)
    if target.format == "torch":
        from .torch_zip import TorchZipWriter

        return TorchZipWriter(path, target.skeleton, crc=options.zip_crc, page_offsets=page_offsets,
                              crc_cache=crc_cache)
    if target.format == "distcp":
        from .torch_dist_io import DistcpWriter

        return DistcpWriter(path, target.skeleton["items"])
    raise FindingError(f"{target.relpath}: unknown output file format {target.format!r}", "output-format",
                       "a saver's TargetFile.format is safetensors, torch or distcp")


def _write_small(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


class _signals_raise:
    """SIGTERM (and SIGHUP) raise :class:`Interrupted` so the staging directory is cleaned up."""

    def __enter__(self) -> None:
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            raise Interrupted(f"conversion interrupted by signal {signal.Signals(signum).name}; "
                              "the partial output was removed")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.previous[sig] = signal.signal(sig, handler)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)


def _progress_bar(total: int, options: ConvertOptions) -> Any:
    show = options.progress if options.progress is not None else sys.stderr.isatty()
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="converting", file=sys.stderr,
                mininterval=0.5, bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}B/{total_fmt}B "
                "[{elapsed} elapsed, ETA {remaining}, {rate_fmt}]")
