"""The user's launch line: who runs it (torchrun, python -m ascend_patch), on how many ranks, with which flags.

``ascend-patch check --memory -- torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py ARGS``:
everything after ``--`` is read as the cluster would run it. :func:`parse_launch_line` finds
the world size and the script and its Megatron arguments; :func:`flag`, :func:`without` and
:func:`with_flag` read and rewrite those arguments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import FindingError

__all__ = ["LaunchLine", "flag", "flag_int", "parse_launch_line", "with_flag", "without"]

# torchrun options that take no value
_TORCHRUN_SWITCHES = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module"}
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class LaunchLine:
    """A parsed launch: ``script`` and its Megatron ``argv``, the node layout and the variables set on the line."""

    script: str
    argv: list[str]
    nnodes: int = 1
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def _error(message: str, remedy: str = "") -> FindingError:
    return FindingError(message, "memory-launch", remedy)


def _count(option: str, value: str) -> int:
    if option == "--nnodes" and ":" in value:  # elastic min:max: the largest world it may run on
        value = value.split(":")[-1]
    if not value.isdigit() or int(value) < 1:
        raise _error(f"the launch line's {option} {value} is not a number of nodes or processes",
                     f"give {option} as a whole number (the estimate simulates that many ranks)")
    return int(value)


def _torchrun(tokens: list[str], env: dict[str, str]) -> LaunchLine:
    nnodes, nproc, module = 1, 1, False
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        name, eq, value = tokens[i].partition("=")
        i += 1
        if name in _TORCHRUN_SWITCHES:
            module = module or name in ("-m", "--module")
            continue
        if not eq:
            if i >= len(tokens):
                raise _error(f"the launch line ends after {name}")
            value = tokens[i]
            i += 1
        if name == "--nnodes":
            nnodes = _count(name, value)
        elif name in ("--nproc-per-node", "--nproc_per_node"):
            nproc = _count(name, value)
    rest = tokens[i:]
    if module:
        if not rest or rest[0] != "ascend_patch":
            raise _error(f"the launch line runs module {rest[0] if rest else '(none)'}",
                         "the estimate runs a script (pretrain_gpt.py, or -m ascend_patch pretrain_gpt.py)")
        rest = rest[1:]
    line = _python(rest, env, accept_interpreter=False)
    line.nnodes, line.nproc_per_node = nnodes, nproc
    return line


def _python(tokens: list[str], env: dict[str, str], accept_interpreter: bool = True) -> LaunchLine:
    rest = list(tokens)
    if accept_interpreter and rest and os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]
    while rest and rest[0] in ("-u", "-O", "-B"):
        rest = rest[1:]
    if rest[:2] == ["-m", "ascend_patch"]:
        rest = rest[2:]
    elif rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        return _torchrun(rest[2:], env)
    elif rest and rest[0] == "-m":
        raise _error(f"the launch line runs module {rest[1] if len(rest) > 1 else '(none)'}",
                     "the estimate runs a script (pretrain_gpt.py, or -m ascend_patch pretrain_gpt.py)")
    if not rest or not rest[0].endswith(".py"):
        raise _error(f"no training script in the launch line ({' '.join(tokens) or 'empty'})",
                     "give the launch after --, e.g. -- torchrun --nproc-per-node 8 pretrain_gpt.py ARGS")
    return LaunchLine(rest[0], rest[1:], env=env)


def parse_launch_line(tokens: Sequence[str]) -> LaunchLine:
    """``[VAR=value ...] torchrun|python [-m ascend_patch] script.py ARGS`` -> :class:`LaunchLine`."""
    items = list(tokens)
    if items and items[0] == "--":
        items = items[1:]
    env = {}
    while items and _ENV.match(items[0]):
        name, _, value = items.pop(0).partition("=")
        env[name] = value
    if not items:
        raise _error("no launch line after --", "give it as the cluster runs it: -- torchrun ... pretrain_gpt.py ARGS")
    program = os.path.basename(items[0])
    if program == "torchrun":
        return _torchrun(items[1:], env)
    if program == "ascend-patch" and items[1:2] == ["run"]:
        return _python(items[2:], env, accept_interpreter=False)
    return _python(items, env)


def _names(name: str) -> tuple[str, str]:
    return f"--{name}", f"--{name.replace('-', '_')}"


def flag(argv: Sequence[str], name: str) -> str | bool | None:
    """The value of ``--name`` in ``argv`` (the last one given), True for a switch, None when absent."""
    spellings = _names(name)
    found: str | bool | None = None
    for i, token in enumerate(argv):
        key, eq, value = token.partition("=")
        if key in spellings:
            if eq:
                found = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found = argv[i + 1]
            else:
                found = True
    return found


def flag_int(argv: Sequence[str], name: str, default: int | None = None) -> int | None:
    """``--name`` as an int (``default`` when absent)."""
    value = flag(argv, name)
    if value is None or value is True:
        return default
    try:
        return int(str(value))
    except ValueError:
        raise _error(f"--{name} {value} in the launch line is not a whole number") from None


def without(argv: Sequence[str], name: str, values: int) -> list[str]:
    """``argv`` without ``--name`` and its ``values`` values (every occurrence)."""
    spellings = _names(name)
    out: list[str] = []
    i = 0
    while i < len(argv):
        key, eq, _ = argv[i].partition("=")
        if key in spellings:
            i += 1 if eq else 1 + values
            continue
        out.append(argv[i])
        i += 1
    return out


def with_flag(argv: Sequence[str], name: str, *values: str) -> list[str]:
    """``argv`` with ``--name VALUES`` replacing any ``--name`` it had (a switch when no values are given)."""
    current = flag(argv, name)
    count = 0 if current is True or current is None else 1
    return [*without(argv, name, count), f"--{name}", *values]
