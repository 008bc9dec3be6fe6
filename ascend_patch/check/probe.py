"""What parallel layout a Megatron checkpoint directory was saved with, read without loading weights.

The directory is read as :mod:`ascend_patch.loaders.megatron_layout` spells it: the
tracker file, the iteration folder, and in the legacy ``torch`` format one
``mp_rank_TT[_PPP][_EEE]/`` folder per rank, where a two-part name is PP or EP (the saved
``args`` decide; without them it is read as PP). The ``torch_dist`` format is re-sharded
on load and has no per-rank folders.

``args`` is read from the first rank file by the converter's safe reader
(:func:`ascend_patch.loaders.torch_io.safe_load`: weights-only unpickling, tensors on the
meta device, inert stand-ins for Megatron's own classes such as the ``AttnBackend`` enum
in Megatron-LM's ``args``), so a process without Megatron reads real Megatron-LM
checkpoints. A file that needs any other global is an error (``unsafe-checkpoint``): it is
read only with ``trust=True`` (full unpickling runs the file's pickle code), which no
message suggests. The same file says whether it was saved with
virtual pipeline stages: ``model0``, ``model1``, ... (one per chunk) instead of ``model``.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import Finding
from ..loaders.megatron_layout import (RANK_FILE, RELEASE, TRACKER, chunk_index, chunk_names, is_distributed,
                                       iteration_dir, iteration_dirs, iteration_of, parse_rank_dir, rank_coordinates,
                                       rank_dir, read_tracker)

__all__ = ["CheckpointLayout", "probe_checkpoint"]

_ARG_NAMES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
              "expert_tensor_parallel_size", "context_parallel_size", "virtual_pipeline_model_parallel_size",
              "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
              "group_query_attention", "num_experts", "seq_length", "padded_vocab_size", "world_size",
              "data_parallel_size", "ckpt_format", "use_distributed_optimizer", "num_layer_list",
              "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


@dataclass
class CheckpointLayout:
    """A checkpoint directory's format, iteration and saved TP/PP/EP (None when unknown)."""

    path: str
    format: str  # "torch" | "torch_dist" | "unknown"
    iteration: int | None
    iteration_dir: str | None
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    vpp: int | None = None  # model chunks per pipeline rank (1: no virtual pipeline)
    args: dict[str, Any] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)  # the checkpoint itself is broken
    notes: list[str] = field(default_factory=list)

    @property
    def reshardable(self) -> bool:
        """torch_dist checkpoints load at any TP/PP; the torch format only at the saved one."""
        return self.format == "torch_dist"


def _read_iteration(path: str, layout: CheckpointLayout) -> str | None:
    from ..loaders.blocks import CorruptCheckpoint

    if not os.path.exists(os.path.join(path, TRACKER)):
        found = iteration_dirs(path)
        if not found:
            layout.problems.append(Finding("not-a-checkpoint", f"{path} has no {TRACKER} and no iter_XXXXXXX/ "
                                           "or release/ folder: it is not a Megatron checkpoint directory"))
            return None
        layout.notes.append(f"no {TRACKER}; using the newest folder {found[-1]}")
        name = found[-1]
    else:
        try:
            name = iteration_dir(read_tracker(path))
        except CorruptCheckpoint as exc:
            layout.problems.append(Finding("tracker", str(exc)))
            return None
    iteration = iteration_of(name)
    layout.iteration = 0 if iteration == RELEASE else iteration
    directory = os.path.join(path, name)
    if not os.path.isdir(directory):
        layout.problems.append(Finding("iteration-missing", f"{TRACKER} points at {name}/, which does not exist in "
                                       f"{path}"))
        return None
    return directory


def _full_load(file: str) -> Any:
    """``torch.load`` with full unpickling (only with --trust-checkpoint: it runs the file's code)."""
    import torch

    try:  # mmap: tensors stay on disk, only the pickled structure is read
        return torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        return torch.load(file, map_location="cpu", weights_only=False)  # legacy (non-zip) file


def _unsafe_finding(file: str, exc: Exception) -> Finding:
    # an error, not a note: the launch would unpickle this file (Megatron loads with weights_only=False),
    # and what it needs cannot be told from data; the remedy never suggests running it
    found = re.search(r"refusing to unpickle (.+?), which", str(exc))
    return Finding("unsafe-checkpoint", f"{file} cannot be read safely: unpickling it needs "
                   f"{found.group(1) if found else 'a global'}, which is neither a plain container, a tensor nor a "
                   "Megatron class, so its args and layout were not checked (nothing from the file was executed)",
                   "do not load it (Megatron's torch.load(weights_only=False) would run that code); take the "
                   "checkpoint from a source you trust, or re-save its tensors and args where it was written")


def _check_rank_file(file: str, trust: bool, layout: CheckpointLayout) -> None:
    """One more rank file, checked as cheaply as reading it allows: its zip directory and local headers,
    its pickle (weights-only, tensors on the meta device) and every model tensor's bytes inside a record."""
    from ..loaders.blocks import CorruptCheckpoint
    from ..loaders.torch_io import UnsafeCheckpoint, check_archive, safe_load

    if not os.path.isfile(file):
        layout.problems.append(Finding("rank-file-missing", f"{file} does not exist: this rank's weights are "
                                       "missing", "copy the whole checkpoint again"))
        return
    try:
        try:
            state = safe_load(file, meta=True)
        except UnsafeCheckpoint as exc:
            if not trust:
                layout.problems.append(_unsafe_finding(file, exc))
            else:
                check_archive(file)
            return
        if not isinstance(state, dict):
            raise CorruptCheckpoint(f"{file} holds a {type(state).__name__}, not a Megatron checkpoint dict")
        names = chunk_names(state)
        if not names:
            raise CorruptCheckpoint(f"{file} holds no 'model' or 'model0..' state dict")
        if layout.vpp is not None and len(names) != layout.vpp:
            layout.problems.append(Finding("vpp-mismatch", f"{file} holds {len(names)} model chunk(s) where the "
                                           f"first rank file holds {layout.vpp}: the files come from different saves"))
        _check_tensor_records(file, state, names, layout)
    except CorruptCheckpoint as exc:
        layout.problems.append(Finding("corrupt", str(exc), "copy this file again from where the checkpoint was "
                                       "saved"))


def _check_tensor_records(file: str, state: dict[str, Any], names: list[str], layout: CheckpointLayout) -> None:
    """Every model tensor's bytes lie inside one data record of the file (a damaged pickle points elsewhere)."""
    from ..loaders.blocks import CorruptCheckpoint
    from ..loaders.torch_io import tensor_infos

    try:
        for name in names:
            chunk = state.get(name)
            if isinstance(chunk, dict):  # tensors on the meta device (not a --trust-checkpoint full load)
                for _ in tensor_infos({k: v for k, v in chunk.items() if getattr(v, "is_meta", False)}, file):
                    pass
    except CorruptCheckpoint as exc:
        layout.problems.append(Finding("corrupt", str(exc), "copy this file again from where the checkpoint was "
                                       "saved"))


def _load_state(file: str, trust: bool, layout: CheckpointLayout) -> dict[str, Any] | None:
    """The rank file's top-level dict, its tensors never read (None, with a note, when unreadable)."""
    from ..loaders.blocks import CorruptCheckpoint
    from ..loaders.torch_io import UnsafeCheckpoint, safe_load

    name = os.path.basename(file)
    try:
        state = safe_load(file, meta=True)
    except UnsafeCheckpoint as exc:
        if not trust:
            layout.problems.append(_unsafe_finding(file, exc))
            return None
        try:
            state = _full_load(file)
        except Exception as exc2:
            layout.notes.append(f"args not read from {file}: {type(exc2).__name__}: {exc2}")
            return None
    except CorruptCheckpoint as exc:
        layout.problems.append(Finding("corrupt", str(exc)))
        return None
    if not isinstance(state, dict):
        layout.notes.append(f"{name} holds a {type(state).__name__}, not a Megatron checkpoint dict")
        return None
    return state


def _read_rank_file(file: str, trust: bool, layout: CheckpointLayout) -> None:
    """``layout.args`` (the parallel and model sizes) and ``layout.vpp`` from one rank file."""
    state = _load_state(file, trust, layout)
    if state is None:
        return
    names = chunk_names(state)
    _check_tensor_records(file, state, names, layout)
    if names and names != ["model"]:
        chunks = [chunk_index(n) for n in names]
        layout.vpp = len(chunks)
        if chunks != list(range(len(chunks))):
            layout.problems.append(Finding("chunks-missing", f"{os.path.basename(file)} holds model chunks "
                                           f"{', '.join(f'model{c}' for c in chunks)}: some are missing"))
    elif names:
        layout.vpp = 1
    args = state.get("args")
    if args is None:
        layout.notes.append(f"{os.path.basename(file)} holds no 'args'")
        return
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    layout.args = {k: values[k] for k in _ARG_NAMES if k in values}
    saved_vpp = layout.args.get("virtual_pipeline_model_parallel_size")
    if layout.vpp is not None and saved_vpp is not None and saved_vpp != layout.vpp:
        layout.problems.append(Finding("args-vs-files", f"the saved args say virtual_pipeline_model_parallel_size="
                                       f"{saved_vpp} but {os.path.basename(file)} holds {layout.vpp} model chunk(s)"))
    if layout.vpp is None and saved_vpp:
        layout.vpp = saved_vpp


def probe_checkpoint(path: str, trust: bool = False) -> CheckpointLayout:
    """The layout of the Megatron checkpoint in ``path`` (problems recorded, never raised)."""
    layout = CheckpointLayout(os.path.abspath(path), "unknown", None, None)
    if not os.path.isdir(path):
        layout.problems.append(Finding("no-such-directory", f"--load {path}: no such directory"))
        return layout
    directory = _read_iteration(path, layout)
    if directory is None:
        return layout
    layout.iteration_dir = directory
    if is_distributed(directory):
        layout.format = "torch_dist"
        common = os.path.join(directory, "common.pt")
        if os.path.exists(common):
            _read_rank_file(common, trust, layout)
        layout.tp = layout.args.get("tensor_model_parallel_size")
        layout.pp = layout.args.get("pipeline_model_parallel_size")
        layout.ep = layout.args.get("expert_model_parallel_size")
        from ..loaders.torch_dist import inspect_dist

        layout.problems += inspect_dist(directory)
        return layout
    ranks = [(parse_rank_dir(e), e) for e in os.listdir(directory)]
    ranks = [(m, e) for m, e in ranks if m is not None and os.path.isdir(os.path.join(directory, e))]
    if not ranks:
        layout.problems.append(Finding("no-rank-folders", f"{directory} has no mp_rank_* folders and no "
                                       "distributed-checkpoint metadata"))
        return layout
    layout.format = "torch"
    first, *others = sorted(e for _, e in ranks)
    rank_file = os.path.join(directory, first, RANK_FILE)
    if os.path.exists(rank_file):
        _read_rank_file(rank_file, trust, layout)
    else:
        layout.problems.append(Finding("rank-file-missing", f"{rank_file} does not exist: this rank's weights are "
                                       "missing", "copy the whole checkpoint again"))
    for other in others:  # a truncated or garbage mp_rank_01 fails the launch as surely as rank 0's
        _check_rank_file(os.path.join(directory, other, RANK_FILE), trust, layout)
    widths = {sum(g is not None for g in m) for m, _ in ranks}
    if len(widths) > 1:
        layout.problems.append(Finding("mixed-rank-folders", f"{directory} mixes mp_rank_* folder shapes "
                                       f"({', '.join(sorted(e for _, e in ranks))})"))
        return layout
    width = widths.pop()
    tps = {m[0] for m, _ in ranks}
    seconds = {m[1] for m, _ in ranks if m[1] is not None}
    thirds = {m[2] for m, _ in ranks if m[2] is not None}
    layout.tp = max(tps) + 1
    args_pp = layout.args.get("pipeline_model_parallel_size")
    args_ep = layout.args.get("expert_model_parallel_size")
    if width == 1:
        layout.pp, layout.ep = 1, 1
    elif width == 3:
        layout.pp, layout.ep = max(seconds) + 1, max(thirds) + 1
    elif args_ep is not None and args_ep > 1 and (args_pp or 1) == 1:
        layout.pp, layout.ep = 1, max(seconds) + 1
    else:
        layout.pp, layout.ep = max(seconds) + 1, 1
        if not layout.args:
            layout.notes.append("mp_rank_TT_XXX folders read as TP x PP (they would be TP x EP for an "
                                "EP>1, PP=1 checkpoint; the saved args would tell)")
    expected = {(t, p, e) for t in range(layout.tp) for p in range(layout.pp) for e in range(layout.ep)}
    present = {rank_coordinates(m, layout.pp, layout.ep) for m, _ in ranks}
    missing = sorted(expected - present)
    if missing:
        names = ", ".join(rank_dir(t, p, e, pp=layout.pp, ep=layout.ep) for t, p, e in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        layout.problems.append(Finding("incomplete", f"{directory} is incomplete: TP={layout.tp} x PP={layout.pp} x "
                                       f"EP={layout.ep} needs {len(expected)} rank folders, {names}{more} missing"))
    for name, folder_value in (("tensor_model_parallel_size", layout.tp), ("pipeline_model_parallel_size", layout.pp),
                               ("expert_model_parallel_size", layout.ep)):
        saved = layout.args.get(name)
        if saved is not None and saved != folder_value:
            layout.problems.append(Finding("args-vs-files", f"the saved args say {name}={saved} but the folders say "
                                           f"{folder_value}"))
    return layout

