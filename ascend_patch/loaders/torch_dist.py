"""The ``torch_dist`` loader and saver: Megatron-LM's default checkpoint format, read and written without a model."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections import Counter
from typing import Any

from ..dtypes import canonical as canonical_dtype
from ..dtypes import itemsize
from ..errors import Finding
from ..models.registry import get_spec_registry
from ..models.weightmap import ExtraState, Piece, TensorPlan, WeightMap, coverage_gaps, invert
from ..parallel import Layout, LayoutError
from .blocks import CorruptCheckpoint, contiguous
from .formats import CheckpointLoader, CheckpointSaver, ConvertOptions, SourceCheckpoint, TargetFile, TargetPlan
from .megatron_args import build_args, config_from_args, source_vocab
from .megatron_layout import (DIST_COMMON, DIST_CONTENT, DIST_CONTENT_JSON, DIST_METADATA, RELEASE, TRACKER,
                              dist_cell, dist_local_spec_name, dist_object_key, distcp_name, is_distributed, iteration_dir, iteration_of,
                              tracked_iteration)
from .preflight import check_vocab
from .resolve import resolve_family, weight_map_for
from .target import target_layout

__all__ = ["DistEntry", "TorchDistLoader", "TorchDistSaver", "dist_entries", "inspect_dist", "locate_dist"]

# keys of a torch_dist checkpoint that are not the model's weights
_NOT_MODEL = ("optimizer.", "rng_state", "rerun_state_machine_state")
_FILE_BYTES = 256 * 1024 * 1024  # an output .distcp holds about this much (files are written in parallel)


# megatron-core saves each tensor once, under a key without the layer number
# (``decoder.layers.self_attention.linear_qkv.weight``), as a *global* tensor: the layers
# stacked on a leading axis, TP shards placed where a TP 1 checkpoint holds them (the QKV
# groups interleaved, fc1 as [gate; up], the vocabulary padded), every rank writing the
# chunks it owns (``.metadata`` says which: offsets and sizes in the global tensor). The
# norms of its local spec keep the Transformer-Engine names (``linear_qkv.layer_norm_weight``)
# and each linear layer's extra state is a ShardedObject per layer.
#
# So a torch_dist checkpoint *is* the TP 1 / PP 1 Megatron layout, cut into boxes: the
# loader describes each stored chunk (one layer of it at a time) as a box of that layout,
# which the family's weight map already relates to the HF tensors; the saver writes that
# layout with one chunk per layer and tensor, which megatron-core re-shards on load to any
# TP / PP. Neither builds a model nor imports megatron-core; tensors stream by block.
@dataclasses.dataclass(frozen=True)
class DistEntry:
    """One model tensor of a torch_dist checkpoint: its key, the grid it is stacked on, one cell of it.

    ``grid`` is () for a tensor stored once (the embedding), (layers,) for a layer's tensor and
    (layers, experts) for an expert's (megatron-core puts the global expert index on an axis of
    its own after the layer axis); ``index`` is this cell and ``plan`` its TP 1 tensor in HF terms."""

    fqn: str
    grid: tuple[int, ...]
    index: tuple[int, ...]
    plan: TensorPlan
    alias: str | None = None  # the name megatron-core's local spec gives this tensor, where it differs

    @property
    def sid(self) -> str:
        return self.fqn + "".join(f"[{i}]" for i in self.index)

    def named(self, fqn: str) -> DistEntry:
        return dataclasses.replace(self, fqn=fqn, alias=None)


def dist_entries(wm: WeightMap, padded_vocab: int) -> list[DistEntry]:
    """Every model tensor of the torch_dist checkpoint of ``wm``'s model, cell by cell, under the TE spec's names.

    ``alias`` is the local spec's name where it differs (an MoE model's pre-MLP norm)."""
    grids = _grids(wm)
    out = []
    for e in wm.megatron_chunk(Layout.build(wm.config.num_layers, 1, 1, 1), 0, 0, 0, "te", padded_vocab):
        if not isinstance(e, ExtraState):
            fqn, cell = dist_cell(e.key)
            out.append(DistEntry(fqn, grids[len(cell)], cell, e, dist_local_spec_name(fqn)))
    return out


def _grids(wm: WeightMap) -> dict[int, tuple[int, ...]]:
    """The stacked axes' sizes by their count: none, layers, layers x experts."""
    layers = wm.config.num_layers
    return {0: (), 1: (layers,), 2: (layers, wm.experts.count if wm.experts is not None else 0)}


def _extra_state_keys(wm: WeightMap, naming: str) -> list[str]:
    """The ShardedObject keys of the linear layers' extra state: per layer, and per layer and expert.

    The same for SequentialMLP and TEGroupedMLP experts (megatron-core keys both alike)."""
    grids = _grids(wm)
    te = naming in ("te", "te_grouped")
    keys = []
    for e in wm.megatron_chunk(Layout.build(wm.config.num_layers, 1, 1, 1), 0, 0, 0, "te" if te else "local", None):
        if isinstance(e, ExtraState) and e.key.startswith("decoder.layers."):
            fqn, cell = dist_cell(e.key)
            keys.append(dist_object_key(fqn, cell, grids[len(cell)]))
    return keys


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
        if hint is None and not options.model_type_hf and not base and not options.family_hint:
            hint = get_spec_registry().for_megatron_args(args).name
        spec, problems = resolve_family(options, config=base, hint=hint)
        vocab, vocab_from = source_vocab(options.true_vocab_size, meta, args)
        notes = []
        stored = metadata.state_dict_metadata
        emb = stored.get("embedding.word_embeddings.weight")
        padded = int(emb.size[0]) if getattr(emb, "size", None) is not None else getattr(args, "padded_vocab_size", None)
        if vocab is None:
            notes.append(f"the true vocabulary size is unknown ({vocab_from}); keeping all {padded} padded rows "
                         "(pass --true-vocab-size to trim)")
        cfg = spec.config_from_hf(base) if base else config_from_args(args, spec.name, vocab or padded)
        if base and vocab and vocab != cfg.vocab_size:
            cfg = dataclasses.replace(cfg, vocab_size=int(vocab))
        padded = int(padded or cfg.vocab_size)
        problems += check_vocab(cfg.vocab_size, int(getattr(args, "make_vocab_size_divisible_by", 1) or 1), 1, padded)
        wm = weight_map_for(spec, cfg)
        expected: dict[str, tuple[int, ...]] = {}
        grids: dict[str, tuple[int, ...]] = {}
        cells: dict[tuple[str, tuple[int, ...]], TensorPlan] = {}
        found = {k: tuple(v.size) for k, v in stored.items() if hasattr(v, "chunks") and not k.startswith(_NOT_MODEL)}
        for entry in dist_entries(wm, padded):
            # a separate norm under the TE spec's name, the local spec's, or both (as the saver writes it)
            names = [n for n in (entry.fqn, entry.alias) if n is not None and n in found] or [entry.fqn]
            for name in names:
                expected[name] = (*entry.grid, *entry.plan.shape)
                grids[name] = entry.grid
                cells[(name, entry.index)] = entry.plan
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
                axes = len(grids[fqn])  # the leading axes that index layers (and experts): one cell each
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
                    box_start, box_size = start[axes:], size[axes:]
                    stride = None if dense else rec.stride[axes:]
                    for cell in itertools.product(*(range(a, a + n) for a, n in zip(start[:axes], size[:axes]))):
                        plan = cells[(fqn, cell)]
                        shift = sum((i - a) * st for i, a, st in zip(cell, start, rec.stride)) * itemsize(dtype)
                        pid = f"{info.relative_path}:{fqn}{''.join(f'[{i}]' for i in cell)}@{list(box_start)}"
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
        ep = int(getattr(args, "expert_model_parallel_size", 1) or 1) if cfg.is_moe else 1
        etp = getattr(args, "expert_tensor_parallel_size", None) if cfg.is_moe else None
        notes.append(f"torch_dist checkpoint saved at TP {tp} x PP {pp}" + (f" x EP {ep}" if cfg.is_moe else "")
                     + (f" (expert-TP {etp})" if etp not in (None, tp) else "") + " (megatron-core re-shards it on load)")
        try:
            layout = Layout.build(cfg.num_layers, tp, pp, 1, ep=ep, expert_tp=None if etp is None else int(etp))
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
            problems=problems, notes=notes,
            vocab_from=vocab_from if vocab is not None else None, vocab_unknown=None if vocab is not None else vocab_from)



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
                                "the checkpoint holds experts: pass its MoE family (--model-type-hf qwen3_moe or "
                                "mixtral); shared experts and dense layers in an MoE model are not mapped" if experts else
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
        target, problems = target_layout(source, options, per_rank_files=False)
        if target is None:
            return TargetPlan(files=[], problems=problems)
        layout, padded, dtype, iteration = target.layout, target.padded_vocab, target.dtype, target.iteration
        wm = source.weight_map
        items: list[tuple[DistItem, TensorPlan | None]] = []
        dtypes: dict[str, str] = {}
        extras = _extra_state_keys(wm, options.naming)
        # an MoE model's pre-MLP norm goes under both specs' names: Megatron-LM loads the file with either
        # --transformer-impl (each spec asks for its own name; an unexpected key is fine by its default
        # --dist-ckpt-strictness)
        entries = [e for entry in dist_entries(wm, padded)
                   for e in ((entry, entry.named(entry.alias)) if entry.alias else (entry,))]
        for entry in entries:
            plan = entry.plan
            dtypes[entry.fqn] = dtype
            cell = DistItem(entry.fqn, slot=Slot(entry.sid, (1,) * len(entry.index) + plan.shape, dtype),
                            global_shape=(*entry.grid, *plan.shape), offsets=(*entry.index, *(0,) * len(plan.shape)))
            items.append((cell, TensorPlan(entry.sid, plan.shape, plan.pieces, plan.rule)))
        items += [(DistItem(key, data=EXTRA_STATE_BYTES), None) for key in extras]
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
        if options.target_ep != 1 or options.target_etp is not None:
            notes.append("torch_dist is re-sharded on load: the expert layout flags have no effect on it (each expert "
                         "is stored once, on its own index; choose EP / expert-TP when launching)")
        return TargetPlan(files=files, side_files=side, commit_files={TRACKER: tracker}, layout=layout,
                          naming="te", padded_vocab=padded, notes=notes,
                          description=f"megatron torch_dist, {cfg.num_layers} layers stacked, {len(files)} "
                          f"file(s), padded vocabulary {padded} (TP {tp}), {options.naming} extra state, {dtype}")


def _jsonable(obj: Any) -> Any:
    """Plain JSON types only (the weights-only loader accepts nothing else in the checkpoint)."""
    return json.loads(json.dumps(obj))

