"""The ``mg`` loader and saver: Megatron's legacy ("torch") checkpoint layout."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..errors import Finding
from ..models.registry import get_spec_registry
from ..models.weightmap import ExtraState, TensorPlan, coverage_gaps, invert
from ..parallel import Layout, LayoutError
from .blocks import CorruptCheckpoint
from .formats import CheckpointLoader, CheckpointSaver, ConvertOptions, SourceCheckpoint, TargetFile, TargetPlan
from .megatron_args import build_args, config_from_args, source_vocab
from .megatron_layout import (RANK_FILE, RELEASE, TRACKER, chunk_names, is_distributed, iteration_dir, iteration_of,
                              parse_rank_dir, rank_coordinates, rank_dir, tracked_iteration)
from .preflight import check_tensors, check_vocab
from .resolve import resolve_family, weight_map_for
from .target import target_layout

__all__ = ["MegatronLoader", "MegatronSaver"]


def _chunk_names(state: Mapping[str, Any], path: str) -> list[str]:
    names = chunk_names(state)
    if not names:
        raise CorruptCheckpoint(f"{path} holds no 'model' or 'model0..' state dict (keys: {', '.join(sorted(state))})")
    return names


_GROUPED = re.compile(r"\.mlp\.experts\.linear_fc1\.weight\d+$")  # TEGroupedMLP's per-expert weights


def _layers_in(keys: Any) -> int:
    found = {int(m.group(1)) for k in keys if (m := re.match(r"decoder\.layers\.(\d+)\.", k))}
    return max(found) + 1 if found else 0


# ``<dir>/latest_checkpointed_iteration.txt`` names the iteration (or ``release``);
# ``iter_{it:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt`` holds one rank:
# ``args``, ``checkpoint_version`` (3.0), ``iteration`` and ``model`` — or ``model0``,
# ``model1``, ... with virtual pipeline chunks. The saver also stores an ``ascend_patch``
# entry (the source's HF config, true vocabulary size, family) that Megatron ignores and
# that makes mg -> hf exact; the loader reads checkpoints without it (Megatron-LM's) from
# ``args`` alone.
class MegatronLoader(CheckpointLoader):
    name = "mg"
    aliases = ("megatron", "mcore", "core", "legacy", "mg_legacy", "torch")
    description = "Megatron legacy layout: latest_checkpointed_iteration.txt + iter_*/mp_rank_*/model_optim_rng.pt"

    def detect(self, path: str) -> bool:
        return os.path.isfile(os.path.join(path, TRACKER))

    def open(self, path: str, options: ConvertOptions) -> SourceCheckpoint:
        from .torch_io import safe_load, tensor_infos

        root, iteration = self._locate(path)
        if is_distributed(root):  # --load-model-type mg names Megatron's checkpoints, whichever --ckpt-format saved them
            from .torch_dist import TorchDistLoader

            return TorchDistLoader().open(path, options)
        parsed = {entry: parts for entry in sorted(os.listdir(root)) if (parts := parse_rank_dir(entry)) is not None}
        if not parsed:
            raise CorruptCheckpoint(f"{root} holds no mp_rank_* directories")
        stated_pp = stated_ep = None
        if any(parts[1] is not None and parts[2] is None for parts in parsed.values()):
            # mp_rank_TT_NNN is PP or EP: the saved args say which (see megatron_layout)
            first_file = os.path.join(root, next(iter(parsed)), RANK_FILE)
            if os.path.isfile(first_file):
                first_args = safe_load(first_file).get("args")
                stated_pp = getattr(first_args, "pipeline_model_parallel_size", None)
                stated_ep = getattr(first_args, "expert_model_parallel_size", None)
        ranks: dict[tuple[int, int, int], str] = {}
        for entry, parts in parsed.items():
            ranks[rank_coordinates(parts, stated_pp, stated_ep)] = os.path.join(root, entry, RANK_FILE)
        tp = 1 + max(t for t, _, _ in ranks)
        pp = 1 + max(p for _, p, _ in ranks)
        ep = 1 + max(e for _, _, e in ranks)
        problems: list[Finding] = []
        absent = [k for k in ((t, p, e) for t in range(tp) for p in range(pp) for e in range(ep)) if k not in ranks]
        if absent:
            raise CorruptCheckpoint(f"{root}: rank directories missing for (tp, pp, ep) {absent} of a TP {tp} x "
                                    f"PP {pp} x EP {ep} checkpoint")
        states: dict[tuple[int, int, int], Any] = {}
        for key, file in ranks.items():
            if not os.path.isfile(file):
                raise CorruptCheckpoint(f"{file} does not exist")
            state = safe_load(file)
            if not isinstance(state, dict):
                raise CorruptCheckpoint(f"{file} does not hold a checkpoint dict")
            states[key] = state
        first = states[(0, 0, 0)]
        args = first.get("args")
        if args is None:
            raise CorruptCheckpoint(f"{ranks[(0, 0, 0)]} has no 'args'; cannot tell the model's sizes")
        meta = first.get("ascend_patch") if isinstance(first.get("ascend_patch"), dict) else {}
        chunks = _chunk_names(first, ranks[(0, 0, 0)])
        vpp = len(chunks)
        counts = []
        for v in range(vpp):
            for p in range(pp):
                counts.append(_layers_in(states[(0, p, 0)][chunks[v]].keys()))
        layout = Layout(tp=tp, pp=pp, vpp=vpp, dp=math.lcm(tp, tp * ep) // tp, ep=ep, layer_counts=tuple(counts))
        for name, value in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                            ("expert_model_parallel_size", ep)):
            stated = getattr(args, name, None)
            if stated is not None and int(stated) != value:
                problems.append(Finding("args-vs-files", f"args.{name} is {stated} but {root} holds {value}",
                                        "the files win; check how this checkpoint was produced"))
        any_keys = [k for st in states.values() for c in _chunk_names(st, "") for k in st[c]]
        naming = "te" if any(k.endswith("layer_norm_weight") for k in any_keys) else "local"
        if any(_GROUPED.search(k) for k in any_keys):
            naming = "te_grouped" if naming == "te" else naming
        base = meta.get("hf_config") if isinstance(meta.get("hf_config"), dict) else None
        hint = meta.get("family")
        if hint is None and not options.model_type_hf and not base and not options.family_hint:
            hint = get_spec_registry().for_megatron_args(args).name  # a checkpoint Megatron-LM wrote
        spec, fam_problems = resolve_family(options, config=base, hint=hint)
        problems += fam_problems
        padded = getattr(args, "padded_vocab_size", None)
        if padded is None:
            emb = states[(0, 0, 0)][chunks[0]].get("embedding.word_embeddings.weight")
            padded = int(emb.shape[0]) * tp if emb is not None else None
        vocab, vocab_from = source_vocab(options.true_vocab_size, meta, args)
        notes = []
        if vocab is None:
            notes.append(f"the true vocabulary size is unknown ({vocab_from}); keeping all {padded} padded rows "
                         "(pass --true-vocab-size to trim)")
        cfg = spec.config_from_hf(base) if base else config_from_args(args, spec.name, vocab or padded)
        if base and vocab and vocab != cfg.vocab_size:
            import dataclasses

            cfg = dataclasses.replace(cfg, vocab_size=int(vocab))
        if cfg.num_layers != layout.num_layers:
            problems.append(Finding("layers-vs-files", f"the config says {cfg.num_layers} layers but the rank files "
                                    f"hold {layout.num_layers} ({','.join(map(str, counts))})",
                                    "the checkpoint is incomplete or its stored config belongs to another model; "
                                    "re-convert or re-save it"))
        if padded is None:
            padded = cfg.vocab_size
        problems += check_vocab(cfg.vocab_size, int(getattr(args, "make_vocab_size_divisible_by", 1) or 1), tp,
                                int(padded))
        wm = weight_map_for(spec, cfg)
        tensors: dict[str, Any] = {}
        plans: dict[str, TensorPlan] = {}
        inventory: dict[str, dict[str, tuple[int, ...] | None]] = {}
        for (t, p, ep_rank), file in sorted(ranks.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            rel = os.path.relpath(file, path)
            state = states[(t, p, ep_rank)]
            names = _chunk_names(state, file)
            if len(names) != vpp:
                problems.append(Finding("vpp-mismatch", f"{rel} holds {len(names)} model chunks, rank 0 holds {vpp}",
                                        "every rank file of a virtual-pipeline checkpoint holds the same number of "
                                        "chunks (model0, model1, ...); the files come from different saves"))
                continue
            for v, chunk in enumerate(names):
                infos = dict(tensor_infos(state[chunk], file))
                where = f"{rel} [{chunk}]"
                inventory[f"{rel}#{chunk}"] = {k: (i.shape if i is not None else None) for k, i in infos.items()}
                try:
                    entries = wm.megatron_chunk(layout, t, p, v, naming, int(padded), ep_rank=ep_rank)
                except LayoutError as exc:
                    problems.append(Finding("layout", f"{where}: {exc}"))
                    continue
                expected = {e.key: e.shape for e in entries if isinstance(e, TensorPlan)}
                found = {k: i.shape for k, i in infos.items() if i is not None and not k.endswith("._extra_state")}
                extras = [k for k in infos if k.endswith("._extra_state")]
                problems += check_tensors(expected, found, where, ignorable=extras)
                for e in entries:
                    if isinstance(e, TensorPlan) and e.key in found and tuple(found[e.key]) == tuple(e.shape):
                        pid = f"{rel}#{chunk}/{e.key}"
                        tensors[pid] = infos[e.key]
                        plans[pid] = e
        canonical, replicas = invert(plans.items())
        for key, missing in coverage_gaps(canonical, wm.hf_tensors()).items():
            problems.append(Finding("coverage", f"{key}: {missing} elements are not held by any rank file",
                                    "a rank file is missing tensors (see above); the checkpoint cannot be rebuilt"))
        dtypes = Counter(i.dtype for i in tensors.values())
        return SourceCheckpoint(
            format=self.name, path=path, spec=spec, config=cfg, weight_map=wm, tensors=tensors,
            canonical=canonical, plans=plans, dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
            hf_config=dict(base or {}), generation_config=meta.get("generation_config"), layout=layout,
            naming=naming, padded_vocab=int(padded),
            make_vocab_size_divisible_by=getattr(args, "make_vocab_size_divisible_by", None),
            iteration=iteration, args=args, replicas=replicas, inventory=inventory, problems=problems, notes=notes,
            vocab_from=vocab_from if vocab is not None else None, vocab_unknown=None if vocab is not None else vocab_from)

    @staticmethod
    def _locate(path: str) -> tuple[str, int | str]:
        tracked = tracked_iteration(path)
        if tracked is not None:
            return tracked
        if is_distributed(path):  # a torch_dist iteration folder itself
            return path, iteration_of(os.path.basename(os.path.normpath(path))) or RELEASE
        if any(parse_rank_dir(e) for e in os.listdir(path)):  # the user pointed at iter_XXXXXXX itself
            found = iteration_of(os.path.basename(os.path.normpath(path)))
            return path, found if found is not None else RELEASE
        entries = ", ".join(sorted(os.listdir(path))[:10]) or "nothing"
        raise CorruptCheckpoint(f"{path} has no {TRACKER} and no mp_rank_* directories (found: {entries}); "
                                "is this a Megatron legacy checkpoint?")


class MegatronSaver(CheckpointSaver):
    name = "mg"
    aliases = ("megatron", "mcore", "core", "legacy", "mg_legacy", "torch")
    description = "Megatron legacy layout for megatron-core GPTModel (local or Transformer-Engine key naming)"
    loader = "mg"

    def plan(self, source: SourceCheckpoint, options: ConvertOptions) -> TargetPlan:
        from .torch_zip import Slot

        cfg = source.config
        target, problems = target_layout(source, options)
        if target is None:
            return TargetPlan(files=[], problems=problems)
        layout, padded, dtype, iteration = target.layout, target.padded_vocab, target.dtype, target.iteration
        pp, ep = layout.pp, layout.ep
        args = build_args(cfg, layout, padded_vocab=padded, divisor=options.make_vocab_size_divisible_by,
                          dtype=dtype, naming=target.naming, iteration=iteration)
        meta = {"format_version": 1, "family": source.spec.name, "vocab_size": cfg.vocab_size,
                "hf_config": _jsonable(source.hf_config) if source.hf_config else None,
                "generation_config": _jsonable(source.generation_config) if source.generation_config else None,
                "naming": options.naming, "layer_counts": list(layout.layer_counts)}
        files = []
        wm = source.weight_map
        for t, p, e in layout.rank_files():
            rel = f"{iteration_dir(iteration)}/{rank_dir(t, p, e, pp=pp, ep=ep)}/{RANK_FILE}"
            obj: dict[str, Any] = {"args": args, "checkpoint_version": 3.0,
                                   "iteration": 0 if iteration == RELEASE else iteration}
            plans: list[TensorPlan] = []
            for v in range(layout.vpp):
                chunk = "model" if layout.vpp == 1 else f"model{v}"
                state: dict[str, Any] = {}
                for entry in wm.megatron_chunk(layout, t, p, v, options.naming, padded, ep_rank=e):
                    if isinstance(entry, ExtraState):
                        state[entry.key] = None
                        continue
                    sid = f"{chunk}/{entry.key}"
                    state[entry.key] = Slot(sid, entry.shape, dtype)
                    plans.append(TensorPlan(sid, entry.shape, entry.pieces, entry.rule))
                obj[chunk] = state
            obj["ascend_patch"] = meta
            files.append(TargetFile(relpath=rel, format="torch", tensors=plans, dtype=dtype, skeleton=obj))
        tracker = (RELEASE if iteration == RELEASE else str(iteration)).encode()
        return TargetPlan(files=files, commit_files={TRACKER: tracker}, layout=layout, naming=options.naming,
                          padded_vocab=padded,
                          description=f"megatron legacy, {layout.describe_shards()}, {options.naming} naming, {dtype}")


def _jsonable(obj: Any) -> Any:
    """Plain JSON types only (the weights-only loader accepts nothing else in the checkpoint)."""
    import json

    return json.loads(json.dumps(obj))
