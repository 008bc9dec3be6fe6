"""``ascend-patch check``: the rank table and every parallel-layout inconsistency, before launch.

Given the world (``--world-size``, or ``--nnodes`` x ``--nproc-per-node``) and the
parallel sizes (Megatron's flag names), optionally the model (``--hf-config``, or
``--num-layers`` / ``--num-attention-heads`` / ...) and a Megatron checkpoint
(``--load``), it prints who holds which TP/CP/EP/DP/PP coordinate and everything that
would fail after launch: sizes that do not fit the world or the model, and a
checkpoint saved with other TP/PP/EP/VPP (with the ``ascend-patch convert`` command that
re-shards it, or, for an expert-TP the legacy layout cannot hold, what to do
instead; see :mod:`.checkpoint`). Exit status 1 when there are errors.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from typing import Any

from ..parallel import DEFAULT_ORDER, Layout, RankRow
from .report import CheckReport, ModelDims, preflight

__all__ = ["format_report", "register"]


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
            **{k: v for k, v in asdict(report.checkpoint).items() if k != "args"},
            "problems": [str(f) for f in report.checkpoint.problems]},
        "errors": [str(f) for f in report.errors], "warnings": [str(f) for f in report.warnings],
        "notes": report.notes,
    }
    return json.dumps(data, indent=2, default=str)


def _run(args: argparse.Namespace) -> int:
    if args.memory:
        from .memory_cli import run_memory

        return run_memory(args, format_report)
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else args.order
    model = ModelDims("the command line", args.num_layers, args.num_attention_heads, args.num_query_groups,
                      args.hidden_size, args.ffn_hidden_size, args.num_experts)
    given = any(v is not None for k, v in asdict(model).items() if k != "source")
    report = preflight(args.world_size, args.nnodes, args.nproc_per_node, args.tp, args.pp, args.cp, args.ep,
                       args.etp, order, args.num_layer_list, args.vpp, args.seq_length, args.sequence_parallel,
                       args.hf_config, model if given else None, args.load, args.trust_checkpoint, args.device,
                       shlex.split(args.megatron_args) if args.megatron_args else None,
                       args.first_stage_layers, args.last_stage_layers)
    print(_json(report) if args.json or args.format == "json" else format_report(report, args.max_rows))
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
    # the short form first, so the usage line shows what README and the docs type
    for short, name, what in (("--tp", "--tensor-model-parallel-size", "tensor"),
                              ("--pp", "--pipeline-model-parallel-size", "pipeline"),
                              ("--cp", "--context-parallel-size", "context"),
                              ("--ep", "--expert-model-parallel-size", "expert")):
        par.add_argument(short, name, type=int, default=None, dest=short[2:],
                         help=f"{what}-parallel size ({short} is short for Megatron's {name})")
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
    mod.add_argument("--vocab-size", type=int, help="the tokenizer's size, when its files are not on this machine")
    mod.add_argument("--megatron-args", metavar="'ARGS'",
                     help="a Megatron command line (quoted): its parallel sizes are the launch's (a different value "
                     "given here too is an error), its model flags are checked against --hf-config or, without "
                     "one, describe the model")
    ck = p.add_argument_group("checkpoint")
    ck.add_argument("--load", help="a Megatron checkpoint directory to be loaded")
    ck.add_argument("--trust-checkpoint", action="store_true",
                    help="read the saved args even when that needs full unpickling (runs the file's code)")
    mem = p.add_argument_group("memory (--memory): will every rank fit? (docs/memory.md)")
    mem.add_argument("--memory", action="store_true",
                     help="estimate each rank's device memory by running the launch's Megatron-LM on fake tensors")
    mem.add_argument("--device-memory", metavar="SIZE", help="the device's memory, e.g. 64GB (overrides --chip)")
    mem.add_argument("--chip", help="the device by name: 910B1, 910B2, 910B2C, 910B3, 910B4, 910B4-1, A3")
    mem.add_argument("--megatron-lm", metavar="DIR", help="with --hf-config: the Megatron-LM checkout to run")
    mem.add_argument("--allocator-margin", type=float, metavar="FRACTION",
                     help="the caching allocator's margin over the tensor peak (default 0.05)")
    mem.add_argument("--runtime-reserved", metavar="SIZE", help="device memory the runtime holds (default 3419MB)")
    mem.add_argument("--no-remedies", action="store_true", help="do not re-estimate changes when a rank does not fit")
    mem.add_argument("launch", nargs=argparse.REMAINDER,
                     help="after --: the launch line as the cluster runs it (torchrun ... pretrain_gpt.py ARGS)")
    out = p.add_argument_group("output")
    out.add_argument("--device", choices=("npu", "cpu"), default="npu",
                     help="target whose NCCL-variable counterparts are checked, and whose memory is estimated "
                     "(default npu)")
    out.add_argument("--max-rows", type=int, default=64)
    out.add_argument("--json", action="store_true")
    out.add_argument("--format", choices=("text", "json"), default="text", help="json: the same as --json")
    p.set_defaults(func=_run)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="ascend-patch")
    register(parser.add_subparsers(dest="command"))
    namespace = parser.parse_args(["check", *sys.argv[1:]])
    sys.exit(namespace.func(namespace))
