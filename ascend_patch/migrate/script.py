"""Reading a launch script the way bash would, for the part launch scripts use.

Line continuations, comments, ``export``, variable assignments and expansion (``$X``, ``${X}``,
``${X:-default}``, word splitting of unquoted expansions such as ``$GPT_ARGS``, none inside
double quotes or in single quotes), ``$((arithmetic))``, ``;``/``&&`` and a pipe after the launch
(``| tee log``). Each statement is expanded, then split into words by :mod:`shlex`. The training
launch is the command that runs a ``*.py`` script through ``torchrun`` / ``python``.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .rules import MigrationError

__all__ = ["Launch", "from_command", "read_script"]

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAUNCHERS = re.compile(r"^(torchrun|python[0-9.]*|deepspeed|accelerate)$")
_TRAINING = ("pretrain_gpt.py", "posttrain_gpt.py")


@dataclass(frozen=True)
class Launch:
    """A training launch: ``launcher`` words, the script, its arguments, the variables it exports."""

    launcher: tuple[str, ...]
    script: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    pipe: str = ""  # what the launch's output is piped to ("tee logs/x.log")


def _statements(text: str) -> list[tuple[str, str]]:
    """(statement, pipe tail) per statement: split at unquoted newlines, ``;``, ``&&``, ``||``; comments gone."""
    out: list[tuple[str, str]] = []
    current: list[str] = []
    pipe: list[str] | None = None
    quote, depth, i = "", 0, 0

    def close() -> None:
        nonlocal current, pipe
        stmt = "".join(current).strip()
        if stmt:
            out.append((stmt, "".join(pipe).strip() if pipe is not None else ""))
        current, pipe = [], None

    while i < len(text):
        ch = text[i]
        target = pipe if pipe is not None else current
        if quote:
            target.append(ch)
            if ch == "\\" and quote == '"' and i + 1 < len(text):
                target.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch == "\\" and i + 1 < len(text):
            target.append(ch + text[i + 1])
            i += 1
        elif ch in "'\"":
            quote = ch
            target.append(ch)
        elif ch == "$" and text[i + 1:i + 2] == "(":
            depth += 1
            target.append("$(")
            i += 1
        elif ch == "(" and depth:
            depth += 1
            target.append(ch)
        elif ch == ")" and depth:
            depth -= 1
            target.append(ch)
        elif depth:
            target.append(ch)
        elif ch == "#" and (not target or target[-1][-1:].isspace()):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif ch == "\n" or ch == ";" or text.startswith(("&&", "||"), i):
            close()
            i += 2 if text.startswith(("&&", "||"), i) else 1
            continue
        elif ch == "|":
            pipe = [] if pipe is None else pipe + ["|"]
        else:
            target.append(ch)
        i += 1
    close()
    return out


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _arith(expr: str) -> int:
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise MigrationError(f"$(({expr})): only integer + - * / % are understood")
    try:
        return value(ast.parse(expr.strip() or "0", mode="eval").body)
    except SyntaxError:
        raise MigrationError(f"$(({expr})): not an arithmetic expression") from None


def _expand(stmt: str, variables: Mapping[str, str]) -> str:
    """``stmt`` with every expansion done, re-quoted so that shlex splits it as bash would."""
    out: list[str] = []
    quote, i = "", 0
    while i < len(stmt):
        ch = stmt[i]
        if ch == "'" and not quote or quote == "'":
            quote = "" if quote == "'" and ch == "'" else ("'" if ch == "'" and not quote else quote)
            out.append(ch)
        elif ch == "\\" and i + 1 < len(stmt):
            out.append(stmt[i:i + 2])
            i += 1
        elif ch == '"':
            quote = "" if quote == '"' else '"'
            out.append(ch)
        elif ch == "$" and i + 1 < len(stmt):
            text, i = _substitution(stmt, i, variables)
            if quote == '"':
                out.append(re.sub(r'(["\\$`])', r"\\\1", text))
            else:
                out.append(" ".join(shlex.quote(w) for w in text.split()))
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _substitution(stmt: str, i: int, variables: Mapping[str, str]) -> tuple[str, int]:
    """The text ``$...`` at ``stmt[i]`` expands to, and the index after it."""
    if stmt.startswith("$((", i):
        end = stmt.find("))", i)
        if end < 0:
            raise MigrationError(f"unclosed $(( in: {stmt[i:i + 40]}")
        inner = _expand(stmt[i + 3:end], variables)
        return str(_arith(inner.replace("'", ""))), end + 2
    if stmt.startswith("$(", i):
        raise MigrationError(f"command substitution is not read: {stmt[i:i + 40]}... (set the value by hand)")
    if stmt.startswith("${", i):
        end = stmt.find("}", i)
        if end < 0:
            raise MigrationError(f"unclosed ${{ in: {stmt[i:i + 40]}")
        name, _, default = stmt[i + 2:end].partition(":-")
        return variables.get(name) or default, end + 1
    found = _NAME.match(stmt, i + 1)
    if found is None:
        return "$", i + 1
    return variables.get(found.group(0), ""), found.end()


def read_script(text: str, environ: Mapping[str, str] | None = None) -> Launch:
    """The training launch of a shell script (``environ``: variables the script inherits)."""
    variables = dict(environ or {})
    exported: dict[str, str] = {}
    launches: list[Launch] = []
    for stmt, pipe in _statements(text.replace("\\\r\n", "").replace("\\\n", "")):
        words = shlex.split(_expand(stmt, variables), posix=True)
        export = bool(words) and words[0] == "export"
        words = words[1:] if export else words
        prefix: dict[str, str] = {}
        while words and _ASSIGN.match(words[0]):
            name, value = _ASSIGN.match(words[0]).groups()  # type: ignore[union-attr]
            prefix[name] = value
            words = words[1:]
        if not words or export:
            variables.update(prefix)
            if export:
                exported.update(prefix)
                exported.update({w: variables.get(w, "") for w in words if _NAME.fullmatch(w)})
            continue
        launch = _as_launch(words, {**exported, **prefix}, pipe)
        if launch is not None:
            launches.append(launch)
    if not launches:
        raise MigrationError("no training launch found: expected a line running a *.py script with torchrun or python")
    training = [launch for launch in launches if os.path.basename(launch.script) in _TRAINING]
    return (training or launches)[-1]


def _as_launch(words: Sequence[str], env: Mapping[str, str], pipe: str) -> Launch | None:
    if not _LAUNCHERS.match(os.path.basename(words[0])):
        return None
    for i, word in enumerate(words[1:], 1):
        if word.endswith(".py") and words[i - 1] != "-m":
            return Launch(tuple(words[:i]), word, tuple(words[i + 1:]), dict(env), pipe)
    return None


def from_command(argv: Sequence[str]) -> Launch:
    """A launch given as words: ``torchrun ... pretrain_gpt.py FLAGS``, ``pretrain_gpt.py FLAGS`` or just FLAGS."""
    words = list(argv)
    if words and _LAUNCHERS.match(os.path.basename(words[0])):
        launch = _as_launch(words, {}, "")
        if launch is None:
            raise MigrationError(f"no *.py script in: {' '.join(words[:6])} ...")
        return launch
    if words and words[0].endswith(".py"):
        return Launch(("torchrun",), words[0], tuple(words[1:]))
    return Launch(("torchrun",), "pretrain_gpt.py", tuple(words))
