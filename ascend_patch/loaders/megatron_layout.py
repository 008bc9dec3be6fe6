"""Megatron's checkpoint directory, as Megatron-LM writes it: the one place that spells it out."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from ..errors import FindingError
from .blocks import CorruptCheckpoint

# ::
#
#     <dir>/latest_checkpointed_iteration.txt      an iteration number, or "release"
#     <dir>/iter_0000100/                          (or release/) one folder per saved iteration
#         mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt   the legacy ("torch") format: one file per rank
#         .metadata, *.distcp, common.pt               the torch_dist format: no rank folders
#
# ``_PPP`` appears when PP > 1 and ``_EEE`` when EP > 1 (Megatron-LM's
# ``get_checkpoint_name``), so a two-part name (``mp_rank_00_001``) is PP or EP: the sizes
# decide, and without them it is read as PP. A rank file holds ``model``, or one
# ``model0``, ``model1``, ... per virtual pipeline chunk. The converter's loader and
# saver, its verification and ``ascend-patch check`` all ask this module.
__all__ = [
    "tracked_iteration",
    "RANK_FILE",
    "RELEASE",
    "TRACKER",
    "DIST_COMMON",
    "DIST_CONTENT",
    "DIST_METADATA",
    "DIST_CONTENT_JSON",
    "chunk_index",
    "distcp_name",
    "dist_cell",
    "dist_local_spec_name",
    "dist_object_key",
    "chunk_names",
    "is_distributed",
    "iteration_dir",
    "iteration_dirs",
    "iteration_of",
    "parse_rank_dir",
    "rank_coordinates",
    "rank_dir",
    "rank_dirs",
    "read_tracker",
]

TRACKER = "latest_checkpointed_iteration.txt"
RANK_FILE = "model_optim_rng.pt"
RELEASE = "release"
# torch_dist (megatron-core dist_checkpointing on torch.distributed.checkpoint): one folder per iteration
DIST_METADATA = ".metadata"  # torch.distributed.checkpoint's Metadata (pickle)
DIST_COMMON = "common.pt"  # torch.save of what is not sharded: args, iteration, checkpoint_version
DIST_CONTENT = "metadata.json"  # megatron-core's backend record
DIST_CONTENT_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                     "common_backend_version": 1}

_RANK_DIR = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?\Z")
_ITERATION_DIR = re.compile(r"iter_(\d+)\Z")
_CHUNK = re.compile(r"model(\d*)\Z")
_DIST_EXPERT = re.compile(r"decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.(.+)\Z")
_DIST_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)\Z")


def rank_dir(tp_rank: int, pp_rank: int = 0, ep_rank: int = 0, *, pp: int = 1, ep: int = 1) -> str:
    """The folder of one rank: ``mp_rank_TT``, with ``_PPP`` when PP > 1 and ``_EEE`` when EP > 1."""
    return f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "") + (f"_{ep_rank:03d}" if ep > 1 else "")


def rank_dirs(tp: int, pp: int = 1, ep: int = 1) -> list[str]:
    """Every rank folder of a TP x PP x EP checkpoint (TP rank slowest, as the names sort)."""
    return [rank_dir(t, p, e, pp=pp, ep=ep) for t in range(tp) for p in range(pp) for e in range(ep)]


def parse_rank_dir(name: str) -> tuple[int, int | None, int | None] | None:
    """``mp_rank_01_002`` -> (1, 2, None): the numbers as written, or None for another name."""
    m = _RANK_DIR.match(name)
    if m is None:
        return None
    return int(m.group(1)), *(int(g) if g is not None else None for g in m.group(2, 3))


def rank_coordinates(parts: tuple[int, int | None, int | None], pp: int | None = None,
                     ep: int | None = None) -> tuple[int, int, int]:
    """(tp, pp, ep) rank of a parsed folder name; a two-part name is EP only when the sizes say
    EP > 1 and PP == 1."""
    tp_rank, second, third = parts
    if third is not None:
        return tp_rank, second or 0, third
    if second is not None and (ep or 1) > 1 and (pp or 1) == 1:
        return tp_rank, 0, second
    return tp_rank, second or 0, 0


def iteration_dir(iteration: int | str) -> str:
    """``iter_0000100`` for 100, ``release`` for "release"."""
    return RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"


def iteration_of(name: str) -> int | str | None:
    """The iteration an ``iter_XXXXXXX`` (or ``release``) folder holds; None for another name."""
    if name == RELEASE:
        return RELEASE
    m = _ITERATION_DIR.match(name)
    return int(m.group(1)) if m else None


def iteration_dirs(path: str) -> list[str]:
    """The iteration folders in ``path``, oldest first (``release`` last)."""
    return sorted(e for e in os.listdir(path) if iteration_of(e) is not None and os.path.isdir(os.path.join(path, e)))


def read_tracker(path: str) -> int | str:
    """The iteration ``path``'s tracker file names (an int, or "release")."""
    tracker = os.path.join(path, TRACKER)
    with open(tracker, encoding="utf-8") as f:
        text = f.read().strip()
    if text == RELEASE:
        return RELEASE
    try:
        return int(text)
    except ValueError:
        raise CorruptCheckpoint(f"{tracker} holds {text!r}, neither an iteration number nor 'release'") from None


def tracked_iteration(path: str) -> tuple[str, int | str] | None:
    """``(iteration folder, iteration)`` named by the tracker file in save dir ``path``, None without one.

    Both Megatron formats keep their iterations this way; a tracker naming a missing folder is an error.
    """
    if not os.path.isdir(path):
        raise CorruptCheckpoint(f"--load-dir {path} is not a directory")
    if not os.path.isfile(os.path.join(path, TRACKER)):
        return None
    iteration = read_tracker(path)
    root = os.path.join(path, iteration_dir(iteration))
    if not os.path.isdir(root):
        raise CorruptCheckpoint(f"{TRACKER} in {path} names iteration {iteration} but {root} does not exist")
    return root, iteration


def is_distributed(iteration_path: str) -> bool:
    """Whether an iteration folder holds a torch_dist checkpoint (re-sharded on load) rather than rank folders."""
    entries = os.listdir(iteration_path)
    return DIST_METADATA in entries or DIST_CONTENT in entries or any(e.endswith(".distcp") for e in entries)


def distcp_name(rank: int, index: int = 0) -> str:
    """``__{rank}_{index}.distcp``: the data files torch.distributed.checkpoint's file-system writer names."""
    return f"__{rank}_{index}.distcp"


def dist_cell(key: str) -> tuple[str, tuple[int, ...]]:
    """A TP 1 / PP 1 legacy key -> its torch_dist key and its cell on the leading (stacked) axes.

    megatron-core saves a layer's tensor once for all layers, the layer on axis 0
    (``decoder.layers.3.X`` -> ``decoder.layers.X``, cell (3,)); an expert's tensor once for all
    layers and experts, the global expert on axis 1. Its name comes from SequentialMLP's
    ``sharded_state_dict`` — and TEGroupedMLP's, which uses the same keys — that prepends
    ``experts.`` to the module path ``mlp.experts.``, so ``decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight``
    is ``decoder.layers.mlp.experts.experts.linear_fc1.weight``, cell (3, 5). Other keys are
    stored whole, cell ().
    """
    if m := _DIST_EXPERT.match(key):
        return f"decoder.layers.mlp.experts.experts.{m.group(3)}", (int(m.group(1)), int(m.group(2)))
    if m := _DIST_LAYER.match(key):
        return f"decoder.layers.{m.group(2)}", (int(m.group(1)),)
    return key, ()


# megatron-core's local spec saves its separate norms under the TE spec's fused names (its layer spec's
# sharded_state_dict_keys_map). For a dense model the TE spec fuses both norms, so both specs agree;
# the TE spec of an MoE model keeps pre_mlp_layernorm apart (no fc1 to fuse it into), so there the two
# specs name it differently and each finds only its own name.
_LOCAL_SPEC_NORMS = (("decoder.layers.input_layernorm.", "decoder.layers.self_attention.linear_qkv.layer_norm_"),
                     ("decoder.layers.pre_mlp_layernorm.", "decoder.layers.mlp.linear_fc1.layer_norm_"))


def dist_local_spec_name(key: str) -> str | None:
    """The torch_dist key megatron-core's local spec uses for the separate norm ``key`` (a TE-spec key), or None."""
    for separate, fused in _LOCAL_SPEC_NORMS:
        if key.startswith(separate):
            return fused + key[len(separate):]
    return None


def dist_object_key(key: str, cell: tuple[int, ...], grid: tuple[int, ...]) -> str:
    """The stored key of a ShardedObject (an ``_extra_state``) at ``cell`` of ``grid``: megatron-core's unique key."""
    return f"{key}/shard_{'.'.join(map(str, cell))}_{'.'.join(map(str, grid))}"


def chunk_names(keys: Iterable[object]) -> list[str]:
    """The model chunks a rank file's keys hold: ``["model"]``, or ``["model0", "model1", ...]`` by index."""
    found = [k for k in keys if isinstance(k, str) and _CHUNK.match(k)]
    if "model" in found:
        return ["model"]
    return sorted((k for k in found if k != "model"), key=chunk_index)


def chunk_index(name: str) -> int:
    """``model`` -> 0, ``model3`` -> 3."""
    m = _CHUNK.match(name)
    if m is None:
        raise FindingError(f"{name!r} is not a model chunk name", "chunk-name",
                           "a Megatron rank file holds model, or model0, model1, ... (one per virtual stage)")
    return int(m.group(1) or 0)
