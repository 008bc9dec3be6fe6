"""A reference re-sharder for the tests: one TP1/PP1 Megatron checkpoint -> any TP/PP layout.

Written from megatron-core's documented parameter layout (column-parallel weights split
on dim 0, row-parallel on dim 1, the gated fc1 as [gate shard; up shard], QKV laid out
per query group so a plain dim-0 split is right, layers placed by stage), so the
multi-process tests can start every layout from the same weights. It handles the tiny
dense models the tests build, nothing more; the product's converter lives in
ascend_patch/loaders.
"""

from __future__ import annotations

import os
import re

import torch

__all__ = ["reshard_checkpoint"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_FC1 = ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias")


def _split(name: str, tensor: torch.Tensor, tp: int, rank: int, gated: bool) -> torch.Tensor:
    if tensor is None or not isinstance(tensor, torch.Tensor):
        return tensor
    if name == "embedding.word_embeddings.weight" or name == "output_layer.weight":
        return tensor.chunk(tp, 0)[rank].clone()
    if name.endswith(_COLUMN):
        return tensor.chunk(tp, 0)[rank].clone()
    if name.endswith(_ROW):
        return tensor.chunk(tp, 1)[rank].clone()
    if name.endswith(_FC1):
        if gated:
            gate, up = tensor.chunk(2, 0)
            return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
        return tensor.chunk(tp, 0)[rank].clone()
    return tensor.clone()  # norms, biases of row-parallel layers, position embeddings


def reshard_checkpoint(src: str, dst: str, tp: int, pp: int) -> None:
    """Write ``src`` (TP1/PP1, legacy layout) to ``dst`` as a TP ``tp`` x PP ``pp`` checkpoint."""
    with open(os.path.join(src, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    state = torch.load(os.path.join(src, f"iter_{iteration:07d}", "mp_rank_00", "model_optim_rng.pt"),
                       map_location="cpu", weights_only=False)
    args, full = state["args"], state["model"]
    gated = bool(args.swiglu)
    layers = args.num_layers
    if layers % pp:
        raise ValueError(f"{layers} layers cannot be split over {pp} stages")
    per_stage = layers // pp
    for t in range(tp):
        for p in range(pp):
            local: dict[str, torch.Tensor] = {}
            for name, tensor in full.items():
                m = _LAYER.match(name)
                if m:
                    index = int(m.group(1))
                    if index // per_stage != p:
                        continue
                    key = f"decoder.layers.{index - p * per_stage}.{m.group(2)}"
                elif name.startswith("embedding."):
                    if p != 0:
                        continue
                    key = name
                elif name.startswith(("decoder.final_layernorm", "output_layer")):
                    if p != pp - 1:
                        continue
                    key = name
                else:
                    key = name
                local[key] = _split(name, tensor, tp, t, gated)
            tied = not args.untie_embeddings_and_output_weights
            if tied and pp > 1 and p == pp - 1:
                local["output_layer.weight"] = _split("output_layer.weight", full["embedding.word_embeddings.weight"],
                                                      tp, t, gated)
            new_args = type(args)(**{**vars(args), "tensor_model_parallel_size": tp,
                                     "pipeline_model_parallel_size": pp})
            name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            folder = os.path.join(dst, f"iter_{iteration:07d}", name)
            os.makedirs(folder, exist_ok=True)
            torch.save({"args": new_args, "checkpoint_version": 3.0, "iteration": iteration, "model": local},
                       os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(dst, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
