"""``ascend-patch check``: the rank table and every parallel-layout inconsistency, before launch.

Given the world (``--world-size``, or ``--nnodes`` x ``--nproc-per-node``) and the
parallel sizes (Megatron's flag names), optionally the model (``--hf-config``, or
``--num-layers`` / ``--num-attention-heads`` / ...) and a Megatron checkpoint
(``--load``), it prints who holds which TP/CP/EP/DP/PP coordinate and everything that
would fail after launch: sizes that do not fit the world or the model, and a
checkpoint saved with other TP/PP/EP/VPP (with the ``ascend-patch convert`` command that
re-shards it, or, for expert-parallel checkpoints the converter refuses, what to do
instead; see :mod:`.checkpoint_check`). Exit status 1 when there are errors.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .checkpoint_check import (
    LaunchLayout,
    checkpoint_findings,
    convert_command,
    resharded_dir,
)
from .checkpoint_probe import CheckpointLayout, probe_checkpoint
from ..parallel import (
    TRAINING_FLAGS,
    ParallelConfigError,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_layers,
    check_query_groups,
    check_seq_length,
    collect,
    divisors,
    format_choices,
    parse_layer_list,
    stages_from_first_last,
    training_split_flags,
)
from ..parallel import DEFAULT_ORDER, Layout, RankRow

# check takes a per-stage list (--num-layer-list) to describe the launch; remedies name training's flags
CHECK_FLAGS = replace(TRAINING_FLAGS, layer_list="--num-layer-list")

__all__ = ["CheckReport", "ModelDims", "convert_command", "format_report", "preflight", "register", "resharded_dir"]


@dataclass
class ModelDims:
    """The model numbers the layout checks need (any may be unknown)."""

    source: str = ""
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_experts: int | None = None


@dataclass
class CheckReport:
    """What ``check`` found. ``errors`` non-empty means the launch would fail."""

    world_size: int | None
    nproc_per_node: int | None
    layout: Layout | None
    model: ModelDims | None
    checkpoint: CheckpointLayout | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[RankRow]:
        return self.layout.rank_table(self.nproc_per_node) if self.layout is not None else []


def _model_from_hf(path: str) -> ModelDims:
    from ..models.hf_config import read_config_json
    from ..models.registry import get_spec_registry

    cfg = read_config_json(path)
    spec = get_spec_registry().for_hf_config(cfg)
    mc = spec.config_from_hf(cfg)
    experts = next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)), None)
    return ModelDims(f"{spec.name} from {path}", mc.num_layers, mc.num_attention_heads, mc.num_query_groups,
                     mc.hidden_size, mc.ffn_hidden_size, int(experts) if experts else None)


def _joint_tp_sizes(m: ModelDims, world_size: int, pp: int, cp: int) -> str:
    """The TP sizes every model rule and the world accept at once (each error lists its own rule's)."""
    import math

    dims = [d for d in (m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size) if d]
    common = math.gcd(*dims) if dims else 1
    fits = [t for t in divisors(common) if world_size % (t * pp * cp) == 0]
    return (f"TP sizes that fit the heads, query groups, FFN and {world_size} ranks (PP={pp}, CP={cp}) together: "
            f"{format_choices(fits)}")


def _model_from_args(args: dict[str, Any], source: str) -> ModelDims | None:
    dims = ModelDims(source, args.get("num_layers"), args.get("num_attention_heads"),
                     args.get("num_query_groups") if args.get("group_query_attention", True) else None,
                     args.get("hidden_size"), args.get("ffn_hidden_size"), args.get("num_experts"))
    known = [v for k, v in asdict(dims).items() if k != "source" and v is not None]
    return dims if known else None


def _node_warnings(report: CheckReport, layout: Layout) -> None:
    per_node = report.nproc_per_node
    if not per_node or per_node >= layout.world_size:
        return
    for dims, name, why in (("tp", "TP", "tensor parallelism all-reduces activations in every layer"),
                            ("cp", "CP", "context parallelism exchanges keys/values in every attention layer")):
        for group in layout.groups(dims):
            nodes = sorted({r // per_node for r in group})
            if len(nodes) > 1:
                report.warnings.append(
                    f"{name} group {group} spans nodes {', '.join(map(str, nodes))}: {why}; keep "
                    f"{name} x (faster dimensions) within the {per_node} devices of a node")
                break


def preflight(world_size: int | None = None, nnodes: int | None = None, nproc_per_node: int | None = None,
              tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
              order: str = DEFAULT_ORDER, num_layer_list: str | list[int] | None = None, vpp: int | None = None,
              seq_length: int | None = None, sequence_parallel: bool = False, hf_config: str | None = None,
              model: ModelDims | None = None, load: str | None = None, trust_checkpoint: bool = False,
              target: str = "npu", megatron_args: Sequence[str] | None = None,
              first_stage_layers: int | None = None, last_stage_layers: int | None = None) -> CheckReport:
    """Everything ``ascend-patch check`` reports, as data.

    With ``hf_config``, model sizes given on the command line (``model``) and the flags of a
    Megatron command line (``megatron_args``) are checked against config.json: each that
    disagrees is an error. An uneven pipeline split is given as ``num_layer_list`` or, as
    Megatron-LM takes it, ``first_stage_layers`` / ``last_stage_layers``.
    """
    report = CheckReport(None, nproc_per_node, None, None, None)
    if nnodes is not None and nproc_per_node is not None:
        nodes_world = nnodes * nproc_per_node
        if world_size is not None and world_size != nodes_world:
            report.errors.append(f"--world-size {world_size} disagrees with --nnodes {nnodes} x "
                                 f"--nproc-per-node {nproc_per_node} = {nodes_world}")
        world_size = world_size or nodes_world
    if world_size is None:
        report.errors.append("give --world-size, or --nnodes and --nproc-per-node")
        return report
    report.world_size = world_size
    if nproc_per_node and world_size % nproc_per_node:
        report.errors.append(f"world size {world_size} is not a whole number of nodes of {nproc_per_node} devices")
    try:
        layout = Layout.from_world(world_size, tp=tp, pp=pp, cp=cp, ep=ep, expert_tp=etp, order=order)
    except ParallelConfigError as exc:
        report.errors.append(str(exc))
        layout = None
    report.layout = layout
    if hf_config:
        try:
            report.model = _model_from_hf(hf_config)
        except (ValueError, LookupError) as exc:
            report.errors.append(f"--hf-config {hf_config}: {exc}")
    if model is not None and report.model is not None and hf_config:
        for name, value in asdict(model).items():
            said = getattr(report.model, name)
            if name != "source" and value is not None and said is not None and value != said:
                report.errors.append(f"--{name.replace('_', '-')} {value} disagrees with {hf_config}, which says "
                                     f"{said}; drop the flag or fix it")
    if megatron_args:
        if not hf_config:
            report.errors.append("--megatron-args is checked against a model config: give --hf-config too")
        elif report.model is not None:
            from ..models.args_cli import disagreements
            from ..models.hf_config import read_config_json
            from ..models.registry import get_spec_registry

            cfg = read_config_json(hf_config)
            spec = get_spec_registry().for_hf_config(cfg)
            problems = disagreements(spec.config_from_hf(cfg), megatron_args, spec=spec.name)
            report.errors.extend(f"{problem} ({hf_config})" for problem in problems)
    if model is not None:
        base = report.model or ModelDims()
        merged = {k: (v if v is not None else getattr(base, k)) for k, v in asdict(model).items() if k != "source"}
        report.model = ModelDims(model.source or base.source, **merged)
    if load:
        report.checkpoint = probe_checkpoint(load, trust=trust_checkpoint)
        saved = _model_from_args(report.checkpoint.args, f"the args saved in {load}")
        if report.model is None:
            report.model = saved
        elif saved is not None:
            for name in ("num_layers", "num_attention_heads", "num_query_groups", "hidden_size", "ffn_hidden_size"):
                mine, theirs = getattr(report.model, name), getattr(saved, name)
                if mine is not None and theirs is not None and mine != theirs:
                    report.errors.append(f"the checkpoint was saved with {name}={theirs} but "
                                         f"{report.model.source} says {mine}: they are different models")
    stages = None
    layer_list = parse_layer_list(num_layer_list)
    m = report.model
    if m is not None:
        checks = []
        if m.num_attention_heads:
            checks.append(lambda: check_heads(m.num_attention_heads, tp))
        if m.num_query_groups:
            checks.append(lambda: check_query_groups(m.num_query_groups, tp, m.num_attention_heads))
        if m.ffn_hidden_size:
            checks.append(lambda: check_ffn_hidden_size(m.ffn_hidden_size, tp))
        if m.num_experts:
            checks.append(lambda: check_experts(m.num_experts, ep))
        tp_errors = collect(*checks)
        report.errors.extend(str(e) for e in tp_errors)
        if any(e.code in ("heads", "query-groups", "ffn") for e in tp_errors):
            report.notes.append(_joint_tp_sizes(m, world_size, pp, cp))
        if m.num_layers:
            try:
                if first_stage_layers is not None or last_stage_layers is not None:
                    if layer_list is not None:
                        raise ParallelConfigError("give the uneven split once: --num-layer-list, or "
                                                  "--decoder-first/last-pipeline-num-layers", "layer-list")
                    layer_list = stages_from_first_last(m.num_layers, pp, first_stage_layers, last_stage_layers)
                stages = check_layers(m.num_layers, pp, vpp, layer_list, flags=CHECK_FLAGS)
                if layer_list is not None and (flags := training_split_flags(stages)):
                    report.notes.append(f"layers per pipeline stage {','.join(map(str, stages))}: megatron-core "
                                        f"builds them with {flags}")
            except ParallelConfigError as exc:
                report.errors.append(str(exc))
    elif layer_list is not None or first_stage_layers is not None or last_stage_layers is not None:
        report.notes.append("the uneven pipeline split was not checked: the number of layers is unknown (give "
                            "--hf-config or --num-layers)")
    if seq_length is not None:
        report.errors.extend(str(e) for e in collect(
            lambda: check_seq_length(seq_length, cp, tp, sequence_parallel)))
    if layout is not None:
        _node_warnings(report, layout)
        if report.checkpoint is not None:
            launch = LaunchLayout(layout.tp, layout.pp, layout.ep, vpp or 1, tuple(stages) if stages else None,
                                  tuple(layer_list) if layer_list else None, m.num_layers if m else None)
            errors, notes = checkpoint_findings(report.checkpoint, launch)
            report.errors.extend(errors)
            report.notes.extend(notes)
    elif report.checkpoint is not None:
        report.errors.extend(report.checkpoint.problems)
    from .env import nccl_environment

    for finding in nccl_environment(target):
        if not finding.effective:
            report.warnings.append(finding.detail)
    return report


def _table(rows: list[RankRow], experts: bool, limit: int) -> str:
    heads = ["rank", "node", "local", "tp", "cp", "ep", "dp", "pp"] + (["etp", "edp"] if experts else [])
    cells = [[str(v) for v in (r.rank, r.node, r.local_rank, r.tp, r.cp, r.ep, r.dp, r.pp)]
             + ([str(r.expert_tp), str(r.expert_dp)] if experts else []) for r in rows]
    shown = cells if limit <= 0 else cells[:limit]
    widths = [max(len(h), *(len(c[i]) for c in shown)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in shown]
    if len(shown) < len(cells):
        lines.append(f"... {len(cells) - len(shown)} more ranks (--max-rows 0 prints all)")
    return "\n".join(lines)


def _groups_summary(layout: Layout) -> list[str]:
    lines = []
    items = [("TP", "tp", "dense"), ("CP", "cp", "dense"), ("DP", "dp", "dense"), ("PP", "pp", "dense")]
    if layout.ep > 1:
        items.append(("EP", "ep", "expert"))
    for name, dims, kind in items:
        groups = layout.groups(dims, kind)
        shown = " ".join(str(g) for g in groups[:4]) + (" ..." if len(groups) > 4 else "")
        lines.append(f"  {name} groups ({len(groups)} x {len(groups[0])}): {shown}")
    return lines


def format_report(report: CheckReport, max_rows: int = 64) -> str:
    """The report as the text ``ascend-patch check`` prints."""
    out = []
    world = report.world_size
    if report.layout is not None:
        count = world // report.nproc_per_node if report.nproc_per_node and world else 0
        nodes = f" ({count} node{'s' if count != 1 else ''} x {report.nproc_per_node})" \
            if count and world % report.nproc_per_node == 0 else ""
        out.append(f"ascend-patch check: {world} ranks{nodes}: {report.layout.describe()}")
    elif world is not None:
        out.append(f"ascend-patch check: {world} ranks")
    m = report.model
    if m is not None:
        known = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in asdict(m).items() if k != "source" and v)
        out.append(f"model ({m.source}): {known}")
    c = report.checkpoint
    if c is not None and c.format != "unknown":
        out.append(f"checkpoint {c.path}: {c.format} format, iteration {c.iteration}, saved TP={c.tp} PP={c.pp} "
                   f"EP={c.ep}" + (f" VPP={c.vpp}" if (c.vpp or 1) > 1 else ""))
    if report.layout is not None:
        out += ["", _table(report.rows, report.layout.ep > 1 or report.layout.etp != report.layout.tp, max_rows), ""]
        out += ["groups:"] + _groups_summary(report.layout)
    for title, items in (("errors", report.errors), ("warnings", report.warnings), ("notes", report.notes)):
        if items:
            out += ["", f"{title} ({len(items)}):"] + [f"  - {item}" for item in items]
    out += ["", f"{len(report.errors)} error(s): fix them before launching" if report.errors else "OK: no errors"]
    return "\n".join(out)


def _json(report: CheckReport) -> str:
    layout = report.layout
    data: dict[str, Any] = {
        "world_size": report.world_size,
        "layout": None if layout is None else {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp,
                                              "ep": layout.ep, "expert_tp": layout.etp, "expert_dp": layout.expert_dp,
                                              "order": "-".join(layout.dims)},
        "ranks": [asdict(r) for r in report.rows],
        "groups": layout.megatron_groups() if layout is not None else {},
        "model": asdict(report.model) if report.model else None,
        "checkpoint": None if report.checkpoint is None else {
            k: v for k, v in asdict(report.checkpoint).items() if k != "args"},
        "errors": report.errors, "warnings": report.warnings, "notes": report.notes,
    }
    return json.dumps(data, indent=2, default=str)


def _run(args: argparse.Namespace) -> int:
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else args.order
    model = ModelDims("the command line", args.num_layers, args.num_attention_heads, args.num_query_groups,
                      args.hidden_size, args.ffn_hidden_size, args.num_experts)
    given = any(v is not None for k, v in asdict(model).items() if k != "source")
    report = preflight(args.world_size, args.nnodes, args.nproc_per_node, args.tp, args.pp, args.cp, args.ep,
                       args.etp, order, args.num_layer_list, args.vpp, args.seq_length, args.sequence_parallel,
                       args.hf_config, model if given else None, args.load, args.trust_checkpoint, args.device,
                       shlex.split(args.megatron_args) if args.megatron_args else None,
                       args.first_stage_layers, args.last_stage_layers)
    print(_json(report) if args.json else format_report(report, args.max_rows))
    return 1 if report.errors else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``check`` command to the ``ascend-patch`` parser."""
    p = sub.add_parser("check", help="print the rank table and every parallel-layout error before launch",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    world = p.add_argument_group("world")
    world.add_argument("--world-size", type=int)
    world.add_argument("--nnodes", type=int)
    world.add_argument("--nproc-per-node", "--nproc_per_node", type=int, dest="nproc_per_node")
    par = p.add_argument_group("parallel sizes (Megatron's flags)")
    par.add_argument("--tensor-model-parallel-size", "--tp", type=int, default=1, dest="tp")
    par.add_argument("--pipeline-model-parallel-size", "--pp", type=int, default=1, dest="pp")
    par.add_argument("--context-parallel-size", "--cp", type=int, default=1, dest="cp")
    par.add_argument("--expert-model-parallel-size", "--ep", type=int, default=1, dest="ep")
    par.add_argument("--expert-tensor-parallel-size", type=int, dest="etp")
    par.add_argument("--num-layer-list", help="layers per pipeline stage, e.g. 7,7,7,7")
    par.add_argument("--decoder-first-pipeline-num-layers", type=int, dest="first_stage_layers",
                     help="layers on the first pipeline stage (Megatron-LM's uneven split)")
    par.add_argument("--decoder-last-pipeline-num-layers", type=int, dest="last_stage_layers",
                     help="layers on the last pipeline stage (Megatron-LM's uneven split)")
    par.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, dest="vpp")
    par.add_argument("--seq-length", type=int)
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--order", default=DEFAULT_ORDER, help=f"rank order (default {DEFAULT_ORDER})")
    par.add_argument("--use-tp-pp-dp-mapping", action="store_true", help="Megatron's tp-cp-ep-pp-dp order")
    mod = p.add_argument_group("model (or --hf-config)")
    mod.add_argument("--hf-config", help="a Hugging Face config.json (or the folder holding it)")
    mod.add_argument("--num-layers", type=int)
    mod.add_argument("--num-attention-heads", type=int)
    mod.add_argument("--num-query-groups", type=int)
    mod.add_argument("--hidden-size", type=int)
    mod.add_argument("--ffn-hidden-size", type=int)
    mod.add_argument("--num-experts", type=int)
    mod.add_argument("--megatron-args", metavar="'ARGS'",
                     help="a Megatron command line (quoted) whose model flags are checked against --hf-config")
    ck = p.add_argument_group("checkpoint")
    ck.add_argument("--load", help="a Megatron checkpoint directory to be loaded")
    ck.add_argument("--trust-checkpoint", action="store_true",
                    help="read the saved args even when that needs full unpickling (runs the file's code)")
    out = p.add_argument_group("output")
    out.add_argument("--device", choices=("npu", "cpu"), default="npu",
                     help="target whose NCCL-variable counterparts are checked (default npu)")
    out.add_argument("--max-rows", type=int, default=64)
    out.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="ascend-patch")
    register(parser.add_subparsers(dest="command"))
    namespace = parser.parse_args(["check", *sys.argv[1:]])
    sys.exit(namespace.func(namespace))
