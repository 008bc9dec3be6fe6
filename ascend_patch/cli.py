"""``ascend-patch``: run | report | doctor, and the commands other modules register (this module only dispatches)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "COMMAND_MODULES"]

# Modules that register subcommands, in the order `--help` lists them. Each command lives with the code
# it drives: its module exposes register(subparsers), which adds its parser with set_defaults(func=...);
# func(args) -> int is the exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "ascend_patch.cli",
    "ascend_patch.check",
    "ascend_patch.loaders.cli",
    "ascend_patch.demo",
    "ascend_patch.models.args_cli",
    "ascend_patch.migrate.cli",
)


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import parse, run

    return run(parse(args.rest, prog="ascend-patch run"))


def _cmd_report(args: argparse.Namespace) -> int:
    import ascend_patch
    from .config import read_settings

    settings = read_settings().with_(enabled=True)  # asking for the table is asking for the patches
    if args.device:
        settings = settings.with_(device=args.device)
    report = ascend_patch.apply(settings)
    try:
        if args.shims:
            _print_shims(report, args)
        elif args.markdown:
            from .adaptors.device.coverage import coverage_markdown

            table = coverage_markdown(report)
            if args.update:
                from .adaptors.device.coverage import replace_table

                replace_table(args.update, table)
                print(f"updated the coverage table in {args.update}")
            else:
                print(table)
        else:
            table = report.patch_table(include_applied=not args.not_applied)
            print(report if args.all else report.summary() + "\n\n" + table)
    finally:
        ascend_patch.remove()
    return 0


def _print_shims(report: Any, args: argparse.Namespace) -> None:
    if not args.markdown:
        print(report.shim_table())
        return
    from .shim import shim_markdown, update_shim_tables

    tables = report.shim_tables()
    if not args.update:
        print(shim_markdown(tables, tables))
        return
    with open(args.update, encoding="utf-8") as f:
        text = f.read()
    with open(args.update, "w", encoding="utf-8") as f:
        f.write(update_shim_tables(text, lambda packages: shim_markdown(tables, packages)))
    print(f"updated the shim tables in {args.update}")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose, format_diagnosis

    print(format_diagnosis(diagnose()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a CUDA script or module patched (as python -m ascend_patch)",
                         add_help=False)
    run.add_argument("rest", nargs=argparse.REMAINDER)
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="print the patch table: applied / deferred / skipped, with reasons")
    report.add_argument("--device", choices=("auto", "npu", "cpu"), help="target to build the table for")
    report.add_argument("--applied", action="store_true", help="list applied patches too (the default; kept for "
                        "scripts that pass it)")
    report.add_argument("--not-applied", action="store_true",
                        help="only what is not applied: deferred, skipped and failed patches")
    report.add_argument("--all", action="store_true", help="everything, including plugin failures")
    report.add_argument("--shims", action="store_true",
                        help="each shim module's names and what they map to, and whether it is served now")
    report.add_argument("--markdown", action="store_true",
                        help="the coverage table (with --shims: the shim tables) as markdown (docs)")
    report.add_argument("--update", metavar="DOC", help="with --markdown: replace the table(s) in DOC in place")
    report.set_defaults(func=_cmd_report)

    doctor = sub.add_parser("doctor", help="versions, devices, and which target auto picks and why")
    doctor.set_defaults(func=_cmd_doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ascend-patch", description=(
        "Run CUDA PyTorch / Megatron code on Ascend NPUs (or the host), and convert checkpoints."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "run":  # everything after `run` belongs to the program
        args = argparse.Namespace(command="run", rest=argv[1:], func=_cmd_run)
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command != "run":
        import ascend_patch

        ascend_patch.cancel_auto_apply()  # tools inspect and convert; they do not run CUDA code
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
