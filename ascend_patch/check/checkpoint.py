"""Does a Megatron checkpoint load at the launch's layout? If not: what differs, and what to do.

The legacy ``torch`` format stores one file per (TP, PP[, EP]) rank, in
``mp_rank_TT[_PPP][_EEE]/``, holding ``model`` (or ``model0``, ``model1``, ... with
virtual pipeline stages); Megatron loads it only at the layout it was saved with. A
dense checkpoint at another TP / PP / VPP is re-sharded with ``ascend-patch convert``
(mg -> mg), and the command printed here is one that runs. An expert-parallel (MoE)
checkpoint is re-sharded the same way (``--target-expert-parallel-size``) when the launch's
expert-TP equals its TP, the only expert-TP the legacy layout holds; otherwise the remedy
is to launch at the saved sizes, or to have Megatron-LM rewrite the checkpoint in the
``torch_dist`` format, which megatron-core re-shards on load.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..errors import Finding
from ..loaders.megatron_layout import rank_dirs
from ..parallel import Layout, ParallelConfigError, parse_layer_list, stages_from_first_last, training_split_flags
from .probe import CheckpointLayout

__all__ = ["checkpoint_findings", "convert_command", "resharded_dir", "saved_stages"]


def resharded_dir(load_dir: str, tp: int, pp: int, vpp: int = 1, ep: int | None = None) -> str:
    """Where :func:`convert_command` writes the re-sharded checkpoint."""
    return (f"{load_dir.rstrip('/')}_tp{tp}_pp{pp}" + (f"_vpp{vpp}" if vpp > 1 else "")
            + (f"_ep{ep}" if ep is not None else ""))


def convert_command(load_dir: str, tp: int, pp: int, vpp: int | None = None,
                    num_layer_list: list[int] | tuple[int, ...] | None = None, ep: int | None = None) -> str:
    """The ``ascend-patch convert`` command that re-shards a Megatron checkpoint to TP/PP(/VPP)(/EP).

    ``vpp`` is written whenever given (``1`` turns the saved chunks back into one ``model``);
    ``ep`` likewise for an MoE checkpoint (``1`` puts every expert in each file).
    """
    save_dir = resharded_dir(load_dir, tp, pp, vpp or 1, ep)
    parts = ["ascend-patch", "convert", "--load-model-type", "mg", "--save-model-type", "mg",
             "--load-dir", load_dir, "--save-dir", save_dir,
             "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp)]
    if ep is not None:
        parts += ["--target-expert-parallel-size", str(ep)]
    if vpp is not None:
        parts += ["--virtual-pipeline-parallel-size", str(vpp)]
    if num_layer_list:
        parts += ["--num-layer-list", ",".join(map(str, num_layer_list))]
    return " ".join(shlex.quote(p) for p in parts)


def saved_stages(ckpt: CheckpointLayout, num_layers: int | None) -> list[int] | None:
    """Layers per pipeline stage of the checkpoint, from its saved args (None when unknown)."""
    args = ckpt.args
    listed = parse_layer_list(args.get("num_layer_list"))
    if listed:
        return listed
    pp = ckpt.pp
    if not num_layers or not pp:
        return None
    first, last = args.get("decoder_first_pipeline_num_layers"), args.get("decoder_last_pipeline_num_layers")
    if first or last:
        try:
            return stages_from_first_last(num_layers, pp, first or None, last or None)
        except ParallelConfigError:
            return None
    return [num_layers // pp] * pp if num_layers % pp == 0 else None


def _range(names: list[str]) -> str:
    return f"{names[0]}/ .. {names[-1]}/" if len(names) > 1 else f"{names[0]}/"


def _span(start: int, count: int) -> str:
    return f"layer {start}" if count == 1 else f"layers {start}-{start + count - 1}"


def _what_differs(ckpt: CheckpointLayout, launch: Layout, stages: list[int] | None,
                  launch_stages: list[int] | None) -> str:
    """Which rank folders and files the launch would read, and why they do not fit."""
    tp, pp, ep, vpp = ckpt.tp or 1, ckpt.pp or 1, ckpt.ep or 1, ckpt.vpp or 1
    have = rank_dirs(tp, pp, ep)
    want = rank_dirs(launch.tp, launch.pp, launch.ep)
    missing = [f for f in want if f not in set(have)]
    if missing:
        who = "rank 0" if missing[0] == want[0] else "the launch"
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return (f"{who} would look for {missing[0]}/{more}, which the checkpoint does not have "
                f"(it has {_range(have)})")
    parts = []
    if pp != launch.pp:
        if stages and vpp == 1 and launch.vpp == 1 and launch_stages:
            parts.append(f"{have[0]}/ holds {_span(0, stages[0])} (PP={pp}) where stage 0 at PP={launch.pp} "
                         f"needs {_span(0, launch_stages[0])}")
        else:
            parts.append(f"{have[0]}/ holds 1/{pp} of the layers (PP={pp}) where stage 0 at PP={launch.pp} "
                         f"needs 1/{launch.pp}")
    if tp != launch.tp:
        parts.append(f"each file holds 1/{tp} of every tensor-parallel weight (TP={tp}) where a rank at "
                     f"TP={launch.tp} needs 1/{launch.tp}")
    if vpp != launch.vpp:
        chunks = ", ".join(f"model{i}" for i in range(vpp)) if vpp > 1 else "one 'model'"
        built = ("one model chunk and reads 'model'" if launch.vpp == 1 else f"{launch.vpp} chunks per rank and "
                 f"reads {', '.join(f'model{i}' for i in range(launch.vpp))}")
        parts.append(f"each file holds {chunks} (VPP={vpp}) where the launch builds {built}")
    unread = len(have) - len(want)
    tail = f"; {unread} of its {len(have)} folders would not be read" if unread > 0 else ""
    return f"the folders the launch reads exist ({_range(want)}), but " + "; ".join(parts) + tail


def _is_expert(ckpt: CheckpointLayout, launch: Layout) -> bool:
    return (ckpt.ep or 1) > 1 or launch.ep > 1 or bool(ckpt.args.get("num_experts"))


def _expert_remedy(ckpt: CheckpointLayout, launch: Layout) -> str:
    saved = f"--tensor-model-parallel-size {ckpt.tp or 1} --pipeline-model-parallel-size {ckpt.pp or 1} " \
            f"--expert-model-parallel-size {ckpt.ep or 1}"
    if (ckpt.vpp or 1) > 1:
        saved += f" --num-virtual-stages-per-pipeline-rank {ckpt.vpp}"
    dist_dir = f"{ckpt.path.rstrip('/')}_dist"
    return (f"ascend-patch convert writes expert-parallel (MoE) checkpoints only with expert-TP = TP (the legacy "
            f"layout names files by TP rank), and the launch has expert-TP {launch.etp} with TP {launch.tp}. Launch "
            f"with the saved sizes ({saved}), or let Megatron-LM rewrite it in the torch_dist format, which "
            f"megatron-core re-shards on load: run your training script once at the saved sizes with "
            f"--load {shlex.quote(ckpt.path)} --ckpt-convert-format torch_dist --ckpt-convert-save "
            f"{shlex.quote(dist_dir)}, then launch with --load {shlex.quote(dist_dir + '/torch_dist')} "
            f"--ckpt-format torch_dist")


def checkpoint_findings(ckpt: CheckpointLayout, launch: Layout,
                        layer_list: Sequence[int] | None = None) -> tuple[list[Finding], list[str]]:
    """(errors, notes) about loading ``ckpt`` at ``launch``; the checkpoint's own problems come first.

    ``launch`` places the model's layers when the model is known; ``layer_list`` is the
    uneven split the launch was given explicitly (the re-shard command repeats it).
    """
    errors, notes = list(ckpt.problems), list(ckpt.notes)
    if ckpt.format == "unknown":
        return errors, notes
    if ckpt.reshardable:
        notes.append(f"{ckpt.path} is a torch_dist checkpoint: megatron-core re-shards it on load, "
                     "so its TP/PP/EP need not match the launch")
        return errors, notes
    sizes = (("TP", ckpt.tp, launch.tp), ("PP", ckpt.pp, launch.pp), ("EP", ckpt.ep, launch.ep),
             ("VPP", ckpt.vpp, launch.vpp))
    differs = [(name, saved, now) for name, saved, now in sizes if saved is not None and saved != now]
    launch_stages = launch.stage_layers() if launch.layer_counts is not None else None
    stages = saved_stages(ckpt, launch.num_layers if launch_stages is not None else None)
    placement = (not differs and launch_stages is not None and stages is not None
                 and list(stages) != launch_stages)
    if not differs and not placement:
        return errors, notes
    vpp_flag = launch.vpp if (ckpt.vpp or 1) > 1 or launch.vpp > 1 else None
    expert = _is_expert(ckpt, launch)
    ep_flag = launch.ep if expert else None
    command = convert_command(ckpt.path, launch.tp, launch.pp, vpp_flag, layer_list, ep_flag)
    then = shlex.quote(resharded_dir(ckpt.path, launch.tp, launch.pp, launch.vpp, ep_flag))
    if placement:
        head = (f"this checkpoint places layers {','.join(map(str, stages or []))} on its {ckpt.pp} pipeline "
                f"stages but the launch places {','.join(map(str, launch_stages or []))}. ")
    else:
        what = " and ".join(f"{n}={s}" for n, s, _ in differs)
        now = " and ".join(f"{n}={v}" for n, _, v in differs)
        head = (f"this checkpoint was saved with {what} but you are launching {now}: the torch format cannot be "
                f"re-sharded on load ({_what_differs(ckpt, launch, stages, launch_stages)}). ")
    code = "checkpoint-placement" if placement else "checkpoint-layout"
    if expert and launch.etp != launch.tp:
        errors.append(Finding(code, head.rstrip(), _expert_remedy(ckpt, launch)))
        return errors, notes
    errors.append(Finding(code, head.rstrip(), f"Re-shard it first:\n      {command}\n    then launch with --load {then}"))
    if layer_list and (flags := training_split_flags(layer_list)):
        notes.append(f"the re-sharded checkpoint places layers {','.join(map(str, layer_list))}; "
                     f"train with {flags} to build the same stages")
    return errors, notes
