"""Run a script, module or command string patched: ``python -m ascend_patch`` and ``ascend-patch run``.

The three forms ``python`` itself has: ``SCRIPT``, ``-m MODULE`` and ``-c CODE``, each with
``sys.argv`` and ``sys.path[0]`` as ``python`` would set them.

Flags are turned into ``ASCEND_PATCH_*`` variables before anything runs, so every
process the program starts (torchrun workers, spawned children) sees the same
settings.
"""

from __future__ import annotations

import argparse
import builtins
import os
import runpy
import sys
import types
from collections.abc import Sequence

__all__ = ["add_run_arguments", "run", "main"]

USAGE = "python -m ascend_patch [options] (SCRIPT | -m MODULE | -c CODE) [args ...]"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "npu", "cpu"),
                        help="target (default: ASCEND_PATCH_DEVICE, else auto)")
    parser.add_argument("--report", nargs="?", const="1", choices=("1", "all"),
                        help="print the migration report at exit (all: on every rank)")
    parser.add_argument("--strict", action="store_true", help="a patch that cannot apply is an error")
    parser.add_argument("--all-processes", action="store_true",
                        help="also patch every Python process the program starts (ASCEND_PATCH_AUTOLOAD=1)")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    parser.add_argument("-c", dest="code", metavar="CODE", help="run a command string, as python -c does")
    parser.add_argument("target", nargs="?", metavar="SCRIPT", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")


def _export(ns: argparse.Namespace) -> None:
    if ns.device:
        os.environ["ASCEND_PATCH_DEVICE"] = ns.device
    if ns.report:
        os.environ["ASCEND_PATCH_REPORT"] = ns.report
    if ns.strict:
        os.environ["ASCEND_PATCH_STRICT"] = "1"
    if ns.all_processes:
        os.environ["ASCEND_PATCH_AUTOLOAD"] = "1"
    os.environ.setdefault("ASCEND_PATCH", "1")


def run(ns: argparse.Namespace) -> int:
    """Apply the patches with the flags' settings, then run the program as ``__main__``."""
    if ns.module is None and ns.target is None and ns.code is None:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    _export(ns)
    import ascend_patch
    from .config import read_settings

    ascend_patch.apply(read_settings())
    if ns.code is not None:
        _run_code(ns.code, list(ns.args))
    elif ns.module is not None:
        argv = [ns.module] + ([ns.target] if ns.target is not None else []) + list(ns.args)
        sys.argv = argv
        runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
    else:
        path = ns.target
        if not os.path.exists(path):
            print(f"ascend_patch: no such script: {path}", file=sys.stderr)
            return 2
        sys.argv = [path, *ns.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        runpy.run_path(path, run_name="__main__")
    return 0


def _run_code(code: str, args: list[str]) -> None:
    """``python -c CODE args``: a fresh ``__main__``, ``sys.argv[0] == "-c"``, the working directory first on the path."""
    sys.argv = ["-c", *args]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def parse(argv: Sequence[str], prog: str = "python -m ascend_patch") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, usage=USAGE,
                                     description="Run a CUDA PyTorch program patched for the target.")
    add_run_arguments(parser)
    # Options belong to us only before the program: everything after SCRIPT / -m MODULE is its own.
    argv = list(argv)
    ours: list[str] = []
    while argv:
        item = argv[0]
        if item in ("-m", "-c") and len(argv) > 1:
            ours += argv[:2]
            argv = argv[2:]
            break
        if not item.startswith("-"):
            break
        ours.append(argv.pop(0))
        if item == "--device" and argv:
            ours.append(argv.pop(0))
        elif item == "--report" and argv and argv[0] in ("1", "all"):
            ours.append(argv.pop(0))
    ns = parser.parse_args(ours)
    if ns.module is None and ns.code is None and argv:
        ns.target, argv = argv[0], argv[1:]
    ns.args = argv
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    return run(ns)
