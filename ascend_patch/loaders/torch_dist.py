"""The ``torch_dist`` loader and saver: Megatron-LM's default checkpoint format, without a model.

megatron-core saves each tensor once, under a key without the layer number
(``decoder.layers.self_attention.linear_qkv.weight``), as a *global* tensor: the layers
stacked on a leading axis, TP shards placed where a TP 1 checkpoint holds them (the QKV
groups interleaved, fc1 as [gate; up], the vocabulary padded), every rank writing the
chunks it owns (``.metadata`` says which: offsets and sizes in the global tensor). The
norms of its local spec keep the Transformer-Engine names (``linear_qkv.layer_norm_weight``)
and each linear layer's extra state is a ShardedObject per layer.

So a torch_dist checkpoint *is* the TP 1 / PP 1 Megatron layout, cut into boxes: the
loader describes each stored chunk (one layer of it at a time) as a box of that layout,
which the family's weight map already relates to the HF tensors; the saver writes that
layout with one chunk per layer and tensor, which megatron-core re-shards on load to any
TP / PP. Neither builds a model nor imports megatron-core; tensors stream by block.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import Counter
from typing import Any

from ..dtypes import canonical as canonical_dtype
from ..dtypes import itemsize
from ..errors import Finding
from ..models.registry import get_spec_registry
from ..models.vocab import padded_vocab_size
from ..models.weightmap import ExtraState, Piece, TensorPlan, WeightMap, coverage_gaps, invert
from ..parallel import Layout, LayoutError
from .blocks import CorruptCheckpoint, contiguous
from .formats import CheckpointLoader, CheckpointSaver, ConvertOptions, SourceCheckpoint, TargetFile, TargetPlan
from .megatron_args import build_args, config_from_args
from .megatron_layout import (DIST_COMMON, DIST_CONTENT, DIST_CONTENT_JSON, DIST_METADATA, RELEASE, TRACKER,
                              distcp_name, is_distributed, iteration_dir, iteration_of,
                              tracked_iteration)
from .preflight import check_tensor_split, check_vocab
from .resolve import resolve_family, weight_map_for

__all__ = ["TorchDistLoader", "TorchDistSaver", "dist_entries", "inspect_dist", "locate_dist"]

_LAYER_KEY = re.compile(r"decoder\.layers\.(\d+)\.(.+)\Z")
# keys of a torch_dist checkpoint that are not the model's weights
_NOT_MODEL = ("optimizer.", "rng_state", "rerun_state_machine_state")
_FILE_BYTES = 256 * 1024 * 1024  # an output .distcp holds about this much (files are written in parallel)


def dist_entries(wm: WeightMap, padded_vocab: int) -> list[tuple[str, int | None, TensorPlan]]:
    """(torch_dist key, global layer or None, the TP 1 tensor in HF terms) for every model tensor."""
    layers = wm.config.num_layers
    layout = Layout.build(layers, 1, 1, 1)
    out = []
    for e in wm.megatron_chunk(layout, 0, 0, 0, "te", padded_vocab):
        if isinstance(e, ExtraState):
            continue
        m = _LAYER_KEY.match(e.key)
        if m:
            out.append((f"decoder.layers.{m.group(2)}", int(m.group(1)), e))
        else:
            out.append((e.key, None, e))
    return out


def _extra_state_keys(wm: WeightMap, naming: str) -> list[tuple[int, str]]:
    layers = wm.config.num_layers
    modules = wm.te_layer_extra_state if naming == "te" else wm.layer_extra_state
    return [(i, f"decoder.layers.{m}._extra_state/shard_{i}_{layers}") for i in range(layers) for m in modules]


def _box(plan: TensorPlan, start: tuple[int, ...], size: tuple[int, ...]) -> tuple[Piece, ...]:
    """The pieces of ``plan`` that fill the box [start, start + size) of it, relative to the box."""
    out = []
    for p in plan.pieces:
        lo = tuple(max(a, b) for a, b in zip(p.dst_start, start))
        hi = tuple(min(a + n, b + m) for a, n, b, m in zip(p.dst_start, p.size, start, size))
        if any(x >= y for x, y in zip(lo, hi)):
            continue
        src = p.src_start if p.src is None else tuple(s + x - d for s, x, d in zip(p.src_start, lo, p.dst_start))
        out.append(Piece(p.src, src, tuple(x - b for x, b in zip(lo, start)), tuple(y - x for x, y in zip(lo, hi))))
    return tuple(out)


def locate_dist(path: str) -> tuple[str, int | str | None]:
    """The iteration folder of the torch_dist checkpoint at ``path`` (the save dir or the folder itself)."""
    tracked = tracked_iteration(path)
    if tracked is not None:
        return tracked
    if is_distributed(path):
        return path, iteration_of(os.path.basename(os.path.normpath(path)))
    raise CorruptCheckpoint(f"{path} has neither {TRACKER} nor {DIST_METADATA}: not a torch_dist checkpoint")


def inspect_dist(root: str) -> list[Finding]:
    """What is wrong with the torch_dist iteration folder ``root`` as files: metadata, data files, coverage.

    Reads ``.metadata`` only (and the data files' sizes): an interrupted or partial save —
    a rank that never wrote its file, a truncated file, chunks that do not cover a tensor —
    shows here before megatron-core fails on it mid-load.
    """
    import math

    from .torch_dist_io import read_dist_metadata

    meta_path = os.path.join(root, DIST_METADATA)
    problems = []
    if not os.path.isfile(os.path.join(root, DIST_COMMON)):
        problems.append(Finding("dist-incomplete", f"{root} has no {DIST_COMMON} (args, iteration)",
                                "the save was interrupted; load an earlier iteration"))
    if not os.path.isfile(meta_path):
        problems.append(Finding("dist-incomplete", f"{root} has no {DIST_METADATA}: the save did not finish "
                                "(torch.distributed.checkpoint writes it last)", "load an earlier iteration"))
        return problems
    try:
        metadata = read_dist_metadata(meta_path)
    except CorruptCheckpoint as exc:
        return problems + [Finding("dist-metadata", str(exc), "load an earlier iteration")]
    sizes: dict[str, int] = {}
    short = []
    for info in metadata.storage_data.values():
        rel = info.relative_path
        if rel not in sizes:
            file = os.path.join(root, rel)
            sizes[rel] = os.path.getsize(file) if os.path.isfile(file) else -1
        if 0 <= sizes[rel] < info.offset + info.length:
            short.append(rel)
    missing = sorted(r for r, n in sizes.items() if n < 0)
    if missing:
        problems.append(Finding("dist-incomplete", f"{root} lacks {len(missing)} data file(s) its {DIST_METADATA} "
                                f"names: {', '.join(missing[:6])}", "copy the whole iteration folder, or load an "
                                "earlier iteration"))
    if short:
        problems.append(Finding("dist-truncated", f"{len(set(short))} data file(s) of {root} end before the items "
                                f"{DIST_METADATA} places in them: {', '.join(sorted(set(short))[:6])}",
                                "the copy or the save was cut short; copy it again or load an earlier iteration"))
    gaps = [k for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")
            and sum(math.prod(c.sizes) for c in v.chunks) != math.prod(v.size)]
    if gaps:
        problems.append(Finding("dist-coverage", f"{len(gaps)} tensor(s) of {root} are not covered by their chunks: "
                                f"{', '.join(gaps[:6])}", "the checkpoint is incomplete; load an earlier iteration"))
    return problems


class TorchDistLoader(CheckpointLoader):
    name = "torch_dist"
    aliases = ("mg_dist", "dist", "mcore_dist")
    description = "Megatron torch_dist: iter_*/.metadata + __*_*.distcp + common.pt (any TP/PP, re-sharded on load)"

    def detect(self, path: str) -> bool:
        try:
            root, _ = locate_dist(path)
        except CorruptCheckpoint:
            return False
        return is_distributed(root)

    def open(self, path: str, options: ConvertOptions) -> SourceCheckpoint:
        from .torch_dist_io import chunk_record, read_common, read_dist_metadata

        root, iteration = locate_dist(path)
        for name in (DIST_METADATA, DIST_COMMON):
            if not os.path.isfile(os.path.join(root, name)):
                raise CorruptCheckpoint(f"{root} lacks {name}: an interrupted save, or not a torch_dist checkpoint "
                                        f"(found: {', '.join(sorted(os.listdir(root))[:10]) or 'nothing'})")
        metadata = read_dist_metadata(os.path.join(root, DIST_METADATA))
        common = read_common(os.path.join(root, DIST_COMMON))
        if not isinstance(common, dict) or common.get("args") is None:
            raise CorruptCheckpoint(f"{root}/{DIST_COMMON} has no 'args'; cannot tell the model's sizes")
        args = common["args"]
        if iteration is None:
            iteration = common.get("iteration")
        meta = common.get("ascend_patch") if isinstance(common.get("ascend_patch"), dict) else {}
        base = meta.get("hf_config") if isinstance(meta.get("hf_config"), dict) else None
        hint = meta.get("family")
        if hint is None and not options.model_type_hf and not base and not options.extra.get("family_hint"):
            hint = get_spec_registry().for_megatron_args(args).name
        spec, problems = resolve_family(options, config=base, hint=hint)
        vocab = options.true_vocab_size or meta.get("vocab_size") or getattr(args, "vocab_size", None)
        notes = []
        stored = metadata.state_dict_metadata
        emb = stored.get("embedding.word_embeddings.weight")
        padded = int(emb.size[0]) if getattr(emb, "size", None) is not None else getattr(args, "padded_vocab_size", None)
        if vocab is None:
            notes.append(f"the true vocabulary size is unknown; keeping all {padded} padded rows "
                         "(pass --true-vocab-size to trim)")
        cfg = spec.config_from_hf(base) if base else config_from_args(args, spec.name, vocab)
        if base and vocab and vocab != cfg.vocab_size:
            cfg = dataclasses.replace(cfg, vocab_size=int(vocab))
        padded = int(padded or cfg.vocab_size)
        problems += check_vocab(cfg.vocab_size, int(getattr(args, "make_vocab_size_divisible_by", 1) or 1), 1, padded)
        wm = weight_map_for(spec, cfg)
        entries = dist_entries(wm, padded)
        expected: dict[str, tuple[int, ...]] = {}
        by_layer: dict[tuple[str, int | None], TensorPlan] = {}
        for fqn, layer, plan in entries:
            expected[fqn] = (cfg.num_layers, *plan.shape) if layer is not None else plan.shape
            by_layer[(fqn, layer)] = plan
        found = {k: tuple(v.size) for k, v in stored.items() if hasattr(v, "chunks") and not k.startswith(_NOT_MODEL)}
        objects = {k: None for k, v in stored.items() if not hasattr(v, "chunks") and "._extra_state/shard_" in k}
        where = os.path.join(os.path.relpath(root, path) if root != path else ".", DIST_METADATA)
        problems += _key_problems(expected, found, where)
        tensors: dict[str, Any] = {}
        plans: dict[str, TensorPlan] = {}
        fds: dict[str, int] = {}
        index = {(i.fqn, tuple(i.offset)): s for i, s in metadata.storage_data.items() if i.offset is not None}
        try:
            for fqn in expected:
                if found.get(fqn) != expected[fqn]:
                    continue
                item = stored[fqn]
                dtype = canonical_dtype(item.properties.dtype)
                stacked = (fqn, None) not in by_layer
                for chunk in item.chunks:
                    start, size = tuple(chunk.offsets), tuple(chunk.sizes)
                    info = index.get((fqn, start))
                    if info is None:
                        raise CorruptCheckpoint(f"{where}: chunk {list(start)} of {fqn} has no storage entry")
                    if getattr(info, "transform_descriptors", None):
                        raise CorruptCheckpoint(f"{root}/{info.relative_path}: {fqn} is stored through "
                                                f"{', '.join(info.transform_descriptors)} (compressed); re-save it "
                                                "without storage transforms")
                    file = os.path.join(root, info.relative_path)
                    if file not in fds:
                        if not os.path.isfile(file):
                            raise CorruptCheckpoint(f"{file} is missing; {DIST_METADATA} places {fqn} in it")
                        fds[file] = os.open(file, os.O_RDONLY)
                    rec = chunk_record(fds[file], file, info.offset, info.length)
                    if rec.shape != size or canonical_dtype(rec.dtype) != dtype:
                        raise CorruptCheckpoint(f"{file}: {fqn} chunk {list(start)} holds {list(rec.shape)} "
                                                f"{canonical_dtype(rec.dtype)}; {DIST_METADATA} says {list(size)} {dtype}")
                    dense = contiguous(size, rec.stride)
                    layers = range(start[0], start[0] + size[0]) if stacked else [None]
                    for layer in layers:
                        plan = by_layer[(fqn, layer)]
                        box_start, box_size = (start[1:], size[1:]) if stacked else (start, size)
                        shift = (layer - start[0]) * rec.stride[0] * itemsize(dtype) if stacked else 0
                        stride = None if dense else (rec.stride[1:] if stacked else rec.stride)
                        pid = f"{info.relative_path}:{fqn}" + (f"[{layer}]" if stacked else "") + f"@{list(box_start)}"
                        tensors[pid] = _info(file, box_size, dtype, rec.data_offset + shift, stride)
                        plans[pid] = TensorPlan(plan.key, box_size, _box(plan, box_start, box_size), plan.rule)
        finally:
            for fd in fds.values():
                os.close(fd)
        try:
            canonical, replicas = invert(plans.items())
        except LayoutError as exc:
            raise CorruptCheckpoint(f"{where}: {exc}") from None
        gaps = coverage_gaps(canonical, wm.hf_tensors()) if not problems else {}  # else the keys above say why
        for key, missing in gaps.items():
            problems.append(Finding("coverage", f"{key}: {missing} elements are not held by any chunk of {where}",
                                    "the checkpoint is incomplete (a rank's save failed?); it cannot be rebuilt"))
        tp = int(getattr(args, "tensor_model_parallel_size", 1) or 1)
        pp = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
        notes.append(f"torch_dist checkpoint saved at TP {tp} x PP {pp} (megatron-core re-shards it on load)")
        try:
            layout = Layout.build(cfg.num_layers, tp, pp, 1)
        except LayoutError:
            layout = Layout.build(cfg.num_layers, 1, 1, 1)
        dtypes = Counter(i.dtype for i in tensors.values())
        return SourceCheckpoint(
            format=self.name, path=path, spec=spec, config=cfg, weight_map=wm, tensors=tensors,
            canonical=canonical, plans=plans, dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
            hf_config=dict(base or {}), generation_config=meta.get("generation_config"), layout=layout,
            naming="te", padded_vocab=padded,
            make_vocab_size_divisible_by=getattr(args, "make_vocab_size_divisible_by", None),
            iteration=iteration, args=args, replicas=replicas, inventory={f"{where}#model": {**found, **objects}},
            problems=problems, notes=notes)



def _info(path: str, shape: tuple[int, ...], dtype: str, offset: int, stride: tuple[int, ...] | None) -> Any:
    from .formats import TensorInfo

    return TensorInfo(path=path, shape=shape, dtype=dtype, offset=offset, stride=stride)


def _key_problems(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], where: str) -> list[Finding]:
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    if missing:
        problems.append(Finding("dist-missing", f"{where} lacks {len(missing)} tensor(s) the model has: "
                                f"{', '.join(missing[:8])}", "the checkpoint is incomplete or of another model; "
                                "check --model-type-hf and the save's log"))
    if unexpected:
        experts = any(".experts." in k or ".router." in k for k in unexpected)
        problems.append(Finding("dist-unexpected", f"{where} holds {len(unexpected)} tensor(s) the "
                                f"{'dense ' if experts else ''}model map does not know: {', '.join(unexpected[:8])}",
                                "MoE torch_dist checkpoints are not converted yet" if experts else
                                "pass the right --model-type-hf, or the checkpoint holds a model this family lacks"))
    for k in wrong:
        problems.append(Finding("dist-shape", f"{where}: {k} is {list(found[k])} globally, the model map expects "
                                f"{list(expected[k])}", "the stored args and the tensors disagree; pass "
                                "--model-type-hf / --true-vocab-size, or re-save the checkpoint"))
    return problems


class TorchDistSaver(CheckpointSaver):
    name = "torch_dist"
    aliases = ("mg_dist", "dist", "mcore_dist")
    description = "Megatron torch_dist (one chunk per layer and tensor; Megatron-LM loads it at any TP/PP)"
    loader = "torch_dist"

    def plan(self, source: SourceCheckpoint, options: ConvertOptions) -> TargetPlan:
        from .torch_dist_io import EXTRA_STATE_BYTES, DistItem, dumps_metadata, item_length
        from .torch_zip import Slot, zip_bytes

        cfg = source.config
        tp = options.target_tp
        # torch_dist is re-sharded on load: the target TP only decides the vocabulary padding, and it
        # must be a TP the model can be split over
        problems = check_tensor_split(cfg.num_attention_heads, cfg.num_query_groups, cfg.ffn_hidden_size, tp)
        problems += check_vocab(cfg.vocab_size, options.make_vocab_size_divisible_by, tp)
        if cfg.is_moe:  # megatron-core shards experts along an expert axis of their own, not written yet
            problems.append(Finding(
                "dist-moe", f"{source.spec.name} has {cfg.num_experts} experts: MoE checkpoints are not written in the "
                "torch_dist format yet (megatron-core keys its experts on an expert axis this saver does not lay out)",
                "write the legacy format (--ckpt-format torch, with --target-expert-parallel-size as you train) and "
                "load it in Megatron-LM with --ckpt-format torch"))
        if options.naming not in ("local", "te"):
            problems.append(Finding("naming", f"unknown key naming {options.naming!r}", "use local or transformer_engine"))
        if problems:
            return TargetPlan(files=[], problems=problems)
        padded = padded_vocab_size(cfg.vocab_size, options.make_vocab_size_divisible_by, tp)
        dtype = canonical_dtype(options.params_dtype) if options.params_dtype else source.dtype
        iteration: int | str = options.iteration if options.iteration is not None else (
            source.iteration if source.format in ("mg", self.name) and source.iteration is not None else 1)
        layout = Layout.build(cfg.num_layers, 1, 1, 1)
        wm = source.weight_map
        items: list[tuple[DistItem, TensorPlan | None]] = []
        dtypes: dict[str, str] = {}
        extras = _extra_state_keys(wm, options.naming)
        for fqn, layer, plan in dist_entries(wm, padded):
            sid = f"{fqn}[{layer}]" if layer is not None else fqn
            shape = (1, *plan.shape) if layer is not None else plan.shape
            dtypes[fqn] = dtype
            glob = (cfg.num_layers, *plan.shape) if layer is not None else plan.shape
            offsets = (layer, *(0,) * len(plan.shape)) if layer is not None else (0,) * len(plan.shape)
            items.append((DistItem(fqn, slot=Slot(sid, shape, dtype), global_shape=glob, offsets=offsets),
                          TensorPlan(sid, plan.shape, plan.pieces, plan.rule)))
        items += [(DistItem(key, data=EXTRA_STATE_BYTES), None) for _, key in extras]
        per_file = min(options.max_shard_size, max(_FILE_BYTES, sum(item_length(i) for i, _ in items) // 8 + 1))
        root = iteration_dir(iteration)
        files: list[TargetFile] = []
        groups: list[tuple[str, list[DistItem]]] = []
        current: list[tuple[DistItem, TensorPlan | None]] = []
        size = 0

        def flush() -> None:
            rel = distcp_name(0, len(groups))
            dist_items = [i for i, _ in current]
            groups.append((rel, dist_items))
            files.append(TargetFile(relpath=f"{root}/{rel}", format="distcp", dtype=dtype,
                                    tensors=[p for _, p in current if p is not None],
                                    skeleton={"items": dist_items}))

        for item, plan in items:
            n = item_length(item)
            if current and size + n > per_file:
                flush()
                current, size = [], 0
            current.append((item, plan))
            size += n
        if current:
            flush()
        args = build_args(cfg, layout, padded_vocab=padded, divisor=options.make_vocab_size_divisible_by, dtype=dtype,
                          naming=options.naming, iteration=iteration)
        # what the checkpoint holds: the model only (Megatron then neither looks for optimizer nor RNG state)
        args.ckpt_format, args.no_save_optim, args.no_save_rng = "torch_dist", True, True
        meta = {"format_version": 1, "family": source.spec.name, "vocab_size": cfg.vocab_size,
                "hf_config": _jsonable(source.hf_config) if source.hf_config else None,
                "generation_config": _jsonable(source.generation_config) if source.generation_config else None,
                "naming": options.naming}
        common = {"args": args, "checkpoint_version": 3.0, "iteration": 0 if iteration == RELEASE else iteration,
                  "ascend_patch": meta}
        side = {f"{root}/{DIST_METADATA}": dumps_metadata(groups, dtypes),
                f"{root}/{DIST_COMMON}": zip_bytes(common),
                f"{root}/{DIST_CONTENT}": json.dumps(DIST_CONTENT_JSON).encode()}
        tracker = (RELEASE if iteration == RELEASE else str(iteration)).encode()
        notes = []
        if options.target_pp != 1 or options.target_vpp != 1 or options.num_layer_list:
            notes.append("torch_dist is re-sharded on load: the pipeline layout flags have no effect on it "
                         "(choose PP / virtual stages / an uneven split when launching)")
        return TargetPlan(files=files, side_files=side, commit_files={TRACKER: tracker}, layout=layout,
                          naming="te", padded_vocab=padded, notes=notes,
                          description=f"megatron torch_dist, {cfg.num_layers} layers stacked, {len(files)} "
                          f"file(s), padded vocabulary {padded} (TP {tp}), {options.naming} extra state, {dtype}")


def _jsonable(obj: Any) -> Any:
    """Plain JSON types only (the weights-only loader accepts nothing else in the checkpoint)."""
    return json.loads(json.dumps(obj))

