"""The ``phi3_hf`` loader and saver: Phi-3's fused HF tensors <-> the llama map's canonical ones."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from ascend_patch.loaders.formats import CheckpointLoader, ConvertOptions, SourceCheckpoint
from ascend_patch.loaders.hf import HFSaver, hf_weight_files
from ascend_patch.loaders.preflight import check_tensors
from ascend_patch.loaders.resolve import resolve_family, weight_map_for
from ascend_patch.models.hf_config import read_config_json
from ascend_patch.models.weightmap import TensorPlan

from .fused import canonical_pieces, fused_plans

__all__ = ["Phi3Loader", "Phi3Saver"]

NAME = "phi3_hf"


class Phi3Loader(CheckpointLoader):
    name = NAME
    description = "Phi-3 Hugging Face checkpoint (fused qkv_proj and gate_up_proj)"

    def detect(self, path: str) -> bool:
        try:
            return read_config_json(path).get("model_type") == "phi3"
        except Exception:
            return False

    def open(self, path: str, options: ConvertOptions) -> SourceCheckpoint:
        config = read_config_json(path)
        tensors, problems, _ = hf_weight_files(path)
        spec, family_problems = resolve_family(options, config=config)
        problems += family_problems
        cfg = spec.config_from_hf(config)
        wm = weight_map_for(spec, cfg)
        canonical_shapes = wm.hf_tensors()
        stored = fused_plans(canonical_shapes)  # what the files should hold, in canonical terms
        expected = {k: p.shape for k, p in stored.items()}
        found = {k: v.shape for k, v in tensors.items()}
        problems += check_tensors(expected, found, path, [k for k in tensors if k.endswith("rotary_emb.inv_freq")])
        usable = {k for k, shape in expected.items() if tuple(found.get(k, ())) == tuple(shape)}
        stored = {k: p for k, p in stored.items() if k in usable}
        dtypes = Counter(tensors[k].dtype for k in usable)
        return SourceCheckpoint(
            format=self.name, path=path, spec=spec, config=cfg, weight_map=wm,
            tensors={k: tensors[k] for k in usable},
            canonical=canonical_pieces(stored),
            plans=stored,
            dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
            hf_config=dict(config), generation_config=_generation_config(path),
            inventory={"": found}, problems=problems)


class Phi3Saver(HFSaver):
    """The hf saver (shards, index, config.json last), writing the fused tensors."""

    name = NAME
    aliases = ()  # not HFSaver's: "hf" and its aliases stay the built-in saver's (the spec adds "phi3")
    description = "Phi-3 Hugging Face checkpoint (fused qkv_proj and gate_up_proj), loadable by from_pretrained"
    loader = NAME

    def tensor_plans(self, source: SourceCheckpoint) -> list[TensorPlan]:
        return list(fused_plans(source.weight_map.hf_tensors()).values())


def _generation_config(path: str) -> dict[str, Any] | None:
    import json

    full = os.path.join(path, "generation_config.json")
    if not os.path.isfile(full):
        return None
    with open(full, encoding="utf-8") as f:
        return json.load(f)
