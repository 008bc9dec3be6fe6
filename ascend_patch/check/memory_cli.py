"""``ascend-patch check --memory``: the layout checks, then every rank's memory, in one report.

The launch line after ``--`` (or ``--hf-config`` with the layout flags and ``--megatron-lm``)
is checked as ``check`` checks any launch; when the layout is valid, :mod:`.memory` estimates
it and its findings join the report's. ``--format json`` prints the memory document only.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

from ..errors import AscendPatchError
from .report import preflight

__all__ = ["run_memory"]


def _launch(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    tokens = list(args.launch or [])
    if tokens and tokens[0] == "--":
        tokens = tokens[1:]
    if tokens:
        return tokens, []
    if not args.hf_config:
        raise AscendPatchError("check --memory needs the launch line after -- (torchrun ... pretrain_gpt.py ARGS), "
                               "or --hf-config with the layout flags and --megatron-lm DIR")
    from .memory.from_config import launch_from_config

    nproc = args.nproc_per_node or args.world_size or 1
    nnodes = args.nnodes or max(1, (args.world_size or nproc) // nproc)
    layout = {"tensor-model-parallel-size": args.tp, "pipeline-model-parallel-size": args.pp,
              "context-parallel-size": args.cp, "expert-model-parallel-size": args.ep,
              "expert-tensor-parallel-size": args.etp, "num-virtual-stages-per-pipeline-rank": args.vpp}
    extra = shlex.split(args.megatron_args) if args.megatron_args else []
    return launch_from_config(args.hf_config, args.megatron_lm, nnodes, nproc, layout, args.seq_length,
                              args.sequence_parallel, extra)


def run_memory(args: argparse.Namespace, format_report: Callable[..., str]) -> int:
    """The ``check --memory`` command (``format_report`` prints check's own report): exit status 1 when a rank
    does not fit or the launch is invalid, 2 when the command line is."""
    from .memory.chips import chip, parse_size
    from .memory.launchline import parse_launch_line
    from .memory.report import format_memory, memory_findings, memory_json
    from .memory.worker import estimate_memory

    as_json = args.json or args.format == "json"
    try:
        tokens, notes = _launch(args)
        line = parse_launch_line(tokens)
        device, name = None, ""
        if args.device_memory:
            device, name = parse_size(args.device_memory), args.device_memory
        elif args.chip:
            found = chip(args.chip)
            device, name = found.hbm_bytes, found.name
        reserved = parse_size(args.runtime_reserved) if args.runtime_reserved else None
        if as_json and device is None:
            # the document's device_bytes and fits say whether every rank fits: they need the device
            raise AscendPatchError("--format json needs the device's memory: give --chip NAME or --device-memory SIZE")
    except AscendPatchError as exc:
        print(f"ascend-patch check --memory: {exc}")
        return 2
    report = preflight(line.world_size, None, line.nproc_per_node, megatron_args=line.argv,
                       hf_config=args.hf_config, target=args.device)
    result = None
    if not report.errors:
        vocab = args.vocab_size
        if vocab is None and args.hf_config:
            from ..models.args_cli import model_config_from_path

            vocab = model_config_from_path(args.hf_config)[0].vocab_size
        result = estimate_memory(tokens, device_bytes=device, target=args.device, vocab_size=vocab,
                                 margin=args.allocator_margin, runtime_reserved=reserved,
                                 remedies=not args.no_remedies)
        result.setdefault("notes", [])
        if "error" not in result:
            result["notes"] = notes + result["notes"]
        errors, warnings = memory_findings(result, name or "the device")
        report.errors.extend(errors)
        report.warnings.extend(warnings)
        if device is None:
            report.notes.append("no device memory given (--chip or --device-memory): the totals are not judged")
    else:
        report.notes.append("the memory estimate did not run: fix the launch's layout first")
    if as_json:
        print(memory_json(result or {"roles": [], "device_bytes": device, "fits": False}))
    else:
        if result is not None:
            print(format_memory(result, name))
            print()
        print(format_report(report, args.max_rows))
    return 1 if report.errors else 0


