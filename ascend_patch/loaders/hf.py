"""The ``hf`` loader and saver: Hugging Face safetensors (sharded with an index, or single)."""

from __future__ import annotations

import math
import glob
import json
import os
import re
from collections import Counter
from typing import Any

from ..dtypes import itemsize
from ..errors import Finding
from ..models.hf_config import ModelConfig, read_config_json
from ..models.weightmap import Piece, TensorPlan
from .blocks import CorruptCheckpoint
from .formats import (CheckpointLoader, CheckpointSaver, ConvertOptions, SourceCheckpoint, TargetFile, TargetPlan,
                      TensorInfo)
from .preflight import check_tensors
from .resolve import resolve_family, weight_map_for
from .target import target_dtype

__all__ = ["HFLoader", "HFSaver", "hf_weight_files", "own_format_problems", "source_from_hf_tensors", "parse_size"]


def _identity(key: str, shape: tuple[int, ...]) -> TensorPlan:
    zeros = (0,) * len(shape)
    return TensorPlan(key, shape, (Piece(key, zeros, zeros, shape),), "identity")


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(f"{path} is not valid JSON: {exc}") from None


def hf_weight_files(path: str) -> tuple[dict[str, TensorInfo], list[Finding], str]:
    """Every tensor in an HF directory's weight files (headers only), problems with its index, and
    the index path ('' when there is none). Loader plugins for HF-like layouts start here."""
    from .safetensors_io import read_safetensors_index
    from .torch_io import safe_load, tensor_infos

    problems: list[Finding] = []
    index_path = None
    chosen = transformers_weights_file(path)
    if chosen is not None and chosen.endswith(".index.json"):
        index_path = os.path.join(path, chosen)
        index = _read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise CorruptCheckpoint(f"{index_path} has no weight_map object")
        files = _index_files(index_path, weight_map)
    elif chosen is not None:
        weight_map, files = None, [chosen]
    else:  # shards without an index: transformers would not load them, the converter reads them all
        weight_map = None
        files = [os.path.basename(p) for p in sorted(glob.glob(os.path.join(path, "*.safetensors")))]
    if chosen is not None:
        # files named as transformers names its weights, of the chosen format, that it would skip: what an earlier
        # save left (pytorch_model.bin beside model.safetensors is the hub's common "same weights twice" layout,
        # and other names -- Mistral's consolidated.safetensors, an adapter -- are not transformers' weights)
        stem = "model" if ".safetensors" in chosen else "pytorch_model"
        ext = ".safetensors" if stem == "model" else ".bin"
        own = re.compile(rf"{stem}(-\d+-of-\d+)?{re.escape(ext)}(\.index\.json)?\Z")
        ignored = sorted(e for e in os.listdir(path) if e != chosen and e not in files and own.match(e))
        if ignored:
            problems.append(Finding("stale-weights", f"{path} holds {', '.join(ignored[:4])}"
                                    f"{' ...' if len(ignored) > 4 else ''} besides {chosen}, which transformers "
                                    "loads: they are not part of the checkpoint", "remove them, or convert into an "
                                    "empty directory"))
    if not files:
        found = ", ".join(sorted(os.listdir(path))[:10]) or "nothing"
        raise CorruptCheckpoint(f"{path} holds no model.safetensors, *.safetensors shards or pytorch_model.bin "
                                f"(found: {found})")
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise CorruptCheckpoint(f"{index_path} lists {name}, which is not in {path}")
        if name.endswith(".safetensors"):
            infos, _ = read_safetensors_index(full)
        else:
            state = safe_load(full)
            if not isinstance(state, dict):
                raise CorruptCheckpoint(f"{full} does not hold a state dict")
            infos = {k: v for k, v in tensor_infos(state, full) if v is not None}
        for key, info in infos.items():
            if key in tensors:
                problems.append(Finding("duplicate-tensor", f"{key} is stored in both {tensors[key].path} and {full}",
                                        "remove one copy"))
            tensors[key] = info
    if weight_map is not None:
        absent = sorted(k for k, f in weight_map.items() if k not in tensors)
        if absent:
            problems.append(Finding("index-mismatch", f"{os.path.basename(index_path)} lists {len(absent)} tensor(s) "
                                    f"its shards do not hold: {', '.join(absent[:5])}", "re-download the checkpoint"))
    return tensors, problems, index_path or ""


# transformers' order (modeling_utils._get_resolved_checkpoint_files, 4.x to 5.x): a single file beats an index
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def transformers_weights_file(path: str) -> str | None:
    """The weights file ``from_pretrained`` reads in ``path`` (a file name in it), or None when there is none.

    config.json's ``transformers_weights`` names it explicitly (confined to the directory);
    otherwise the first of model.safetensors, its index, pytorch_model.bin, its index.
    """
    config_path = os.path.join(path, "config.json")
    if os.path.isfile(config_path):
        config = _read_json(config_path)
        explicit = config.get("transformers_weights") if isinstance(config, dict) else None
        if explicit is not None:
            _index_files(config_path, {"transformers_weights": explicit},
                         kind=(".safetensors.index.json", ".safetensors"))
            if not os.path.isfile(os.path.join(path, explicit)):
                raise CorruptCheckpoint(f"{config_path} names transformers_weights {explicit!r}, which is not in "
                                        f"{path}")
            return explicit
    return next((name for name in _WEIGHT_FILES if os.path.isfile(os.path.join(path, name))), None)


def _index_files(index_path: str, weight_map: dict[Any, Any], kind: str | tuple[str, ...] | None = None) -> list[str]:
    """The files an index names, each a relative path inside its directory of the index's own kind.

    A name that leaves the directory (``../other/x.safetensors``, ``/abs/x``) would make the
    converter read another checkpoint's weights as this one's; a ``.bin`` or ``.json`` in a
    safetensors index would be read with the wrong reader. Both are refused by name.
    """
    if kind is None:
        kind = ".safetensors" if index_path.endswith(".safetensors.index.json") else ".bin"
    index = os.path.basename(index_path)
    bad = [(k, v) for k, v in weight_map.items() if not isinstance(k, str) or not isinstance(v, str) or not v]
    if bad:
        raise CorruptCheckpoint(f"{index_path}: weight_map entries must map tensor names to file names; "
                                f"{len(bad)} do not (first: {bad[0][0]!r}: {bad[0][1]!r})")
    files = sorted(set(weight_map.values()))
    if not files:
        raise CorruptCheckpoint(f"{index_path} maps no tensors to files (an empty weight_map): fix or re-download "
                                f"{index}")
    for name in files:
        parts = name.replace("\\", "/").split("/")
        if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or "" in parts or "\0" in name:
            raise CorruptCheckpoint(f"{index_path} points outside its checkpoint directory ({name!r}); every file "
                                    f"of a checkpoint lies in {os.path.dirname(index_path)}: fix or re-download "
                                    f"{index}")
        if not name.endswith(kind):
            what = kind if isinstance(kind, str) else " or ".join(kind)
            raise CorruptCheckpoint(f"{index_path} lists {name!r}, which is not a {what} file: {index} names "
                                    f"only {what} shards; fix or re-download it")
    return files


# Reading also accepts ``pytorch_model.bin`` (and its index) through the weights-only
# ``.pt`` reader. Writing produces what ``transformers`` ``save_pretrained`` does: one
# ``model.safetensors`` or ``model-0000K-of-0000N.safetensors`` shards with
# ``model.safetensors.index.json``, plus ``config.json`` (written last) and
# ``generation_config.json`` when the source had one. A tied model writes no
# ``lm_head.weight``.
class HFLoader(CheckpointLoader):
    name = "hf"
    aliases = ("huggingface", "hf_safetensors")  # the families add theirs (llama_hf, qwen3_hf, ...)
    description = "Hugging Face checkpoint: config.json + safetensors (sharded or single) or pytorch_model.bin"

    def detect(self, path: str) -> bool:
        return os.path.isfile(os.path.join(path, "config.json")) and bool(
            glob.glob(os.path.join(path, "*.safetensors")) or os.path.isfile(os.path.join(path, "pytorch_model.bin")))

    def open(self, path: str, options: ConvertOptions) -> SourceCheckpoint:
        if not os.path.isdir(path):
            raise CorruptCheckpoint(f"--load-dir {path} is not a directory")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise CorruptCheckpoint(_no_config(path))
        config = read_config_json(path)
        tensors, file_problems, _ = hf_weight_files(path)
        gen_path = os.path.join(path, "generation_config.json")
        generation = _read_json(gen_path) if os.path.isfile(gen_path) else None
        return source_from_hf_tensors(self.name, path, config, tensors, options, file_problems, generation)


def _no_config(path: str) -> str:
    """Why an HF --load-dir without config.json cannot be read, and which loader it looks like it needs."""
    from .megatron_layout import TRACKER, iteration_of, parse_rank_dir

    entries = sorted(os.listdir(path))
    if not entries:
        return (f"--load-dir {path} is empty: there is no checkpoint to convert. Check the path: a Hugging Face "
                f"checkpoint holds config.json and *.safetensors; a Megatron one {TRACKER} and iter_*/ "
                "folders, read with --loader mg")
    if TRACKER in entries or any(iteration_of(e) is not None or parse_rank_dir(e) for e in entries):
        return (f"--load-dir {path} is a Megatron checkpoint ({', '.join(entries[:3])}"
                f"{', ...' if len(entries) > 3 else ''}), not a Hugging Face one (no config.json); "
                "pass --loader mg (or --load-model-type mg) to read it")
    return (f"no config.json in --load-dir {path} (found: {', '.join(entries[:10])}"
            f"{', ...' if len(entries) > 10 else ''}): a Hugging Face checkpoint needs its config.json; "
            "for a Megatron checkpoint pass --loader mg")


def source_from_hf_tensors(fmt: str, path: str, config: dict[str, Any], tensors: dict[str, TensorInfo],
                           options: ConvertOptions, problems: list[Finding] | None = None,
                           generation_config: dict[str, Any] | None = None) -> SourceCheckpoint:
    """A SourceCheckpoint for tensors stored under their HF names (any storage: a loader plugin's helper).

    Resolves the family, checks the tensor set against the weight map (missing,
    unexpected, mis-shaped), and makes the identity canonical view.
    """
    problems = list(problems or [])
    spec, family_problems = resolve_family(options, config=config)
    problems += family_problems
    wrong_format = own_format_problems(spec, fmt, "loader")
    problems += wrong_format
    cfg: ModelConfig = spec.config_from_hf(config)
    wm = weight_map_for(spec, cfg)
    expected = wm.hf_tensors()
    ignorable = [k for k in tensors if k.endswith("rotary_emb.inv_freq")]
    notes = []
    if ignorable:
        notes.append(f"ignoring {len(ignorable)} rotary inv_freq buffer(s) (recomputed by every framework)")
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        ignorable.append("lm_head.weight")
        notes.append("the model ties its embeddings; the stored lm_head.weight copy is not used")
    notes += cfg.notes  # what config.json asks for that the megatron-core model will not do (sliding window)
    found = {k: v.shape for k, v in tensors.items()}
    if not wrong_format:  # else every tensor would be "missing" or "unexpected": only the symptom
        problems += check_tensors(expected, found, f"{path}", ignorable)
    usable = {k: s for k, s in expected.items() if k in found and tuple(found[k]) == tuple(s)}
    counts = Counter(tensors[k].dtype for k in usable)
    dtype = counts.most_common(1)[0][0] if counts else "float32"
    if len(counts) > 1:
        notes.append(f"mixed tensor dtypes {dict(counts)}; converting all to the target dtype")
    declared = config.get("dtype", config.get("torch_dtype"))
    if counts and isinstance(declared, str) and declared.replace("torch.", "") != dtype:
        notes.append(f"config.json declares {declared.replace('torch.', '')} but the tensors are {dtype}; the "
                     f"output keeps {dtype} unless --params-dtype says otherwise")
    return SourceCheckpoint(
        format=fmt, path=path, spec=spec, config=cfg, weight_map=wm,
        tensors={k: tensors[k] for k in usable},
        canonical={k: [Piece(k, (0,) * len(s), (0,) * len(s), tuple(s))] for k, s in usable.items()},
        plans={k: _identity(k, tuple(s)) for k, s in usable.items()},
        dtype=dtype, hf_config=dict(config), generation_config=generation_config,
        inventory={"": {k: v.shape for k, v in tensors.items()}},
        problems=problems, notes=notes)


def parse_size(text: str | int) -> int:
    """'5GB' / '500MB' / '100KB' / an int -> bytes (decimal units, as transformers)."""
    if isinstance(text, int):
        return text
    s = text.strip().upper()
    for unit, mult in (("GIB", 1024**3), ("MIB", 1024**2), ("KIB", 1024), ("GB", 10**9), ("MB", 10**6),
                       ("KB", 10**3), ("B", 1)):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * mult)
    return int(s)


def own_format_problems(spec: Any, fmt: str, kind: str) -> list[Finding]:
    """A family whose HF files are not the weight map's own tensors (fused q/k/v, say) names the
    loader / saver that handles them in ``spec.hf_format``; any other HF format would
    misread or miswrite them."""
    wanted = getattr(spec, "hf_format", None)
    if not wanted or wanted == fmt:
        return []
    owner = f" (from plugin {spec.owner})" if getattr(spec, "owner", "") else ""
    return [Finding("hf-format", f"{spec.name} checkpoints store their tensors in their own layout, which the "
                    f"{fmt!r} {kind} does not {'read' if kind == 'loader' else 'write'}",
                    f"use --{kind} {wanted}{owner}")]


class HFSaver(CheckpointSaver):
    name = "hf"
    aliases = ("huggingface", "hf_safetensors")
    description = "Hugging Face checkpoint: safetensors shards + index + config.json, loadable by from_pretrained"
    loader = "hf"

    def plan(self, source: SourceCheckpoint, options: ConvertOptions) -> TargetPlan:
        dtype = target_dtype(source, options)
        problems = own_format_problems(source.spec, self.name, "saver")
        if not source.hf_config and source.spec.config_to_hf is None:
            problems.append(Finding("hf-config", f"the source holds no HF config.json and the {source.spec.name} "
                                    "family cannot write one from Megatron args (its spec has no config_to_hf)",
                                    "convert from a checkpoint that stores its HF config (one ascend-patch wrote), "
                                    "or give the family a config_to_hf"))
        if problems:
            return TargetPlan(files=[], problems=problems)
        tensors = self.tensor_plans(source)
        limit = max(1, options.max_shard_size)
        shards: list[list[TensorPlan]] = [[]]
        size = 0
        for t in tensors:
            n = itemsize(dtype) * math.prod(t.shape)
            if shards[-1] and size + n > limit:
                shards.append([])
                size = 0
            shards[-1].append(t)
            size += n
        total = len(shards)
        files = []
        weight_map: dict[str, str] = {}
        for k, shard in enumerate(shards, 1):
            name = "model.safetensors" if total == 1 else f"model-{k:05d}-of-{total:05d}.safetensors"
            files.append(TargetFile(relpath=name, format="safetensors", tensors=shard, dtype=dtype,
                                    metadata={"format": "pt"}))
            weight_map.update({t.key: name for t in shard})
        side: dict[str, bytes] = {}
        if total > 1:
            index = {"metadata": {"total_size": sum(f.nbytes for f in files)}, "weight_map": weight_map}
            side["model.safetensors.index.json"] = _dump(index)
        if source.generation_config is not None:
            side["generation_config.json"] = _dump(source.generation_config)
        config = self._config(source, dtype)
        return TargetPlan(files=files, side_files=side, commit_files={"config.json": _dump(config)},
                          description=f"hf safetensors, {total} shard(s), {dtype}")

    def tensor_plans(self, source: SourceCheckpoint) -> list[TensorPlan]:
        """The tensors to write, as pieces of the canonical (weight-map) tensors: here each
        canonical tensor as it is. A saver for a layout that fuses or renames tensors (see
        examples/plugins) subclasses this saver and overrides only this method."""
        return [_identity(k, tuple(s)) for k, s in source.weight_map.hf_tensors().items()]

    @staticmethod
    def _config(source: SourceCheckpoint, dtype: str) -> dict[str, Any]:
        cfg = source.config
        if source.hf_config:
            config = dict(source.hf_config)
            config.pop("transformers_weights", None)  # names the source's weights file, not the one written here
            if "torch_dtype" in config and "dtype" not in config:
                config["torch_dtype"] = dtype
            else:
                config["dtype"] = dtype
        else:
            config = source.spec.config_to_hf(cfg, dtype)
        config["vocab_size"] = cfg.vocab_size
        config["tie_word_embeddings"] = cfg.tie_word_embeddings
        return config


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
