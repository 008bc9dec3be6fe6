"""``ascend-patch args --hf-config PATH``: the Megatron arguments for a Hugging Face model."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from ..dtypes import DTYPES, SHORT_NAMES
from ..errors import AscendPatchError, Finding
from .hf_config import ModelConfig, read_config_json

__all__ = ["disagreements", "format_args", "model_config_from_path", "register"]


# Prints the flags Megatron-LM / the example ``pretrain_gpt.py`` need to build the model
# that ``config.json`` describes, with the layer spec that serves it and the vocabulary
# (true size, and the padded size Megatron will build for the TP size given): the
# architecture, the dropout rates the model trains with (Megatron's default is 0.1), and
# ``--spec NAME``, the family's layer spec, whose state-dict names are the ones ``ascend-patch
# convert`` writes (under ascend_patch, Megatron-LM's ``--spec`` takes the registered name).
# The argv is valid Megatron: Megatron has no flag for the padded vocabulary, it pads
# ``--vocab-size`` itself. ``--check FLAG ...`` compares a command line with the config instead and lists
# each disagreement (exit status 1 when there is one); ``ascend-patch check`` uses
# :func:`disagreements` for the same comparison.
def model_config_from_path(path: str, spec: str | None = None) -> tuple[ModelConfig, str]:
    """(ModelConfig, spec name) for a ``config.json`` (or a directory holding one)."""
    from .registry import get_spec_registry

    raw = read_config_json(path)
    registry = get_spec_registry()
    model_spec = registry.get(spec) if spec else registry.for_hf_config(raw)
    return model_spec.config_from_hf(raw), model_spec.name


def _parse_argv(argv: Sequence[str]) -> dict[str, Any]:
    """``["--num-layers", "28", "--swiglu", "--data-path", "a", "b"]`` -> {"num-layers": "28", "swiglu": True,
    "data-path": ["a", "b"]}.

    A flag takes every value up to the next ``--flag``: one value is a string, several a list
    (Megatron's ``--spec module attr``, ``--data-path a b c``). Words before the first flag
    (the program, when a whole command line is pasted) are skipped.
    """
    given: dict[str, Any] = {}
    items = list(argv)
    i = 0
    while i < len(items) and not items[i].startswith("--"):
        i += 1
    while i < len(items):
        name, eq, value = items[i][2:].partition("=")
        name = name.replace("_", "-")
        i += 1
        values = [value] if eq else []
        while i < len(items) and not items[i].startswith("--"):
            values.append(items[i])
            i += 1
        given[name] = True if not values else values[0] if len(values) == 1 else values
    return given


def _same(expected: Any, given: Any) -> bool:
    if expected is True or given is True:
        return expected is given
    try:
        return float(expected) == float(given)
    except (TypeError, ValueError):
        return str(expected) == str(given)


def disagreements(mc: ModelConfig, argv: Sequence[str], make_vocab_size_divisible_by: int = 128,
                  spec: str | None = None) -> list[Finding]:
    """Each flag in ``argv`` that contradicts ``mc`` (and each switch the model needs that is missing).

    ``spec`` is the name of the spec serving the config: a ``--spec NAME`` naming another
    family is a disagreement (Megatron's ``--spec module attr`` names code, and is not judged).
    """
    expected = mc.megatron_args(make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    given = _parse_argv(argv)
    compared = dict(given)
    if given.get("tokenizer-type") == "NullTokenizer" and isinstance(given.get("vocab-size"), str):
        # Megatron's NullTokenizer, up to megatron-core 0.17, adds its end-of-document id after --vocab-size ids;
        # Megatron-LM main's counts it among them. The flags do not say which runs: either reading agrees
        with contextlib.suppress(ValueError):
            size = int(given["vocab-size"])
            if "vocab-size" in expected and _same(expected["vocab-size"], str(size + 1)):
                compared["vocab-size"] = str(size + 1)
    problems = []
    for name, value in given.items():
        if name in expected and not _same(expected[name], compared[name]):
            shown = "" if value is True else f" {' '.join(value) if isinstance(value, list) else value}"
            want = "(a bare switch)" if expected[name] is True else str(expected[name])
            if name == "vocab-size" and given.get("tokenizer-type") == "NullTokenizer":
                want += (f" (give {int(expected[name]) - 1} with megatron-core up to 0.17, whose NullTokenizer adds "
                         f"its end-of-document id, or {expected[name]} with Megatron-LM main, whose counts it)")
            problems.append(Finding("flag-value", f"--{name}{shown}: config.json says {want}"))
    switches = ("swiglu", "disable-bias-linear", "add-qkv-bias", "qk-layernorm",
                "untie-embeddings-and-output-weights", "group-query-attention", "use-rope-scaling")
    for name in switches:
        if expected.get(name) is True and name not in given:
            problems.append(Finding("flag-missing", f"--{name} is missing: the model needs it"))
    for name in switches:
        if given.get(name) is True and name not in expected:
            problems.append(Finding("flag-unused", f"--{name} is given but the model does not use it"))
    problems += _precision_problems(mc, given)
    if spec is not None and "spec" in given:
        problems += _spec_problems(given["spec"], spec)
    return problems


def _spec_problems(value: Any, serving: str) -> list[Finding]:
    from .registry import UnknownSpec, get_spec_registry

    words = value if isinstance(value, list) else str(value).split()
    if value is True or len(words) != 1:
        return []
    try:
        named = get_spec_registry().get(words[0]).name
    except UnknownSpec as exc:
        return [Finding("spec", f"--spec {words[0]}: {exc}")]
    if named != serving:
        return [Finding("spec", f"--spec {words[0]}: config.json describes a {serving} model", f"use --spec {serving}")]
    return []


# the half precisions, by their Megatron flag: a model saved in one overflows or loses range in the other
_PRECISION = {short: name for short, name in SHORT_NAMES.items() if DTYPES[name].itemsize == 2}


def _precision_problems(mc: ModelConfig, given: dict[str, Any]) -> list[Finding]:
    """A half-precision flag for a model saved in the other half precision (bf16 weights overflow fp16)."""
    if given.get("bf16") is True and given.get("fp16") is True:
        keep = f"use --{mc.params_dtype}" if mc.params_dtype in _PRECISION else "drop one"
        return [Finding("precision", "--fp16 and --bf16 are both given: Megatron takes one", keep)]
    problems = []
    for flag in _PRECISION:
        if given.get(flag) is True and mc.params_dtype in _PRECISION and mc.params_dtype != flag:
            problems.append(Finding("precision", f"--{flag}: config.json says the model is "
                                    f"{_PRECISION[mc.params_dtype]} (torch_dtype/dtype)", f"use --{mc.params_dtype}"))
    return problems


def format_args(mc: ModelConfig, spec: str, fmt: str = "lines", tensor_parallel_size: int = 1,
                make_vocab_size_divisible_by: int = 128) -> str:
    """The arguments as commented lines, one argv line, or JSON."""
    args = mc.megatron_args(make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    padded = mc.padded_vocab(make_vocab_size_divisible_by, tensor_parallel_size)
    if fmt == "json":
        return json.dumps({"spec": spec, "args": args, "vocab": {
            "true": mc.vocab_size, "padded": padded, "tensor_parallel_size": tensor_parallel_size,
            "divisible_by": make_vocab_size_divisible_by}}, indent=2)
    argv = [*mc.megatron_argv(make_vocab_size_divisible_by=make_vocab_size_divisible_by), "--spec", spec]
    if fmt == "argv":
        return " ".join(argv)
    arch = ", ".join(mc.architectures) or mc.model_type
    lines = [f"# {arch} (model_type {mc.model_type}): layer spec {spec!r} (--spec {spec})",
             f"# vocabulary: {mc.vocab_size} tokens in config.json; Megatron builds {padded} rows at "
             f"TP={tensor_parallel_size} (a multiple of {make_vocab_size_divisible_by} x {tensor_parallel_size})"]
    if padded != mc.vocab_size:
        lines.append(f"# the {padded - mc.vocab_size} padding rows are dropped again when exporting to HF")
    flags: list[str] = []
    for key, value in args.items():
        flags.append(f"--{key}" if value is True else f"--{key} {value}")
    flags.append(f"--spec {spec}")
    lines += [f"{flag} \\" for flag in flags[:-1]] + flags[-1:]
    return "\n".join(lines)


def _cmd_args(ns: argparse.Namespace) -> int:
    import sys

    from .hf_config import ConfigMismatch
    from .registry import UnknownSpec

    try:
        mc, spec = model_config_from_path(ns.hf_config, ns.spec)
    except (ConfigMismatch, UnknownSpec) as exc:
        print(f"ascend-patch args: {exc}", file=sys.stderr)
        return 2
    if ns.check is not None:
        check = [a for a in ns.check if a != "--"]
        try:
            problems = disagreements(mc, check, ns.make_vocab_size_divisible_by, spec)
        except ValueError as exc:
            print(f"ascend-patch args --check: {exc}", file=sys.stderr)
            return 2
        for line in problems:
            print(line)
        if not problems:
            print(f"the {len(_parse_argv(check))} given arguments agree with {ns.hf_config}")
        return 1 if problems else 0
    try:
        text = format_args(mc, spec, ns.format, ns.tensor_model_parallel_size, ns.make_vocab_size_divisible_by)
    except AscendPatchError as exc:  # a size that is not one (--make-vocab-size-divisible-by 0)
        print(f"ascend-patch args: {exc}", file=sys.stderr)
        return 2
    print(text)
    for note in mc.notes:  # stderr: the arguments on stdout stay usable as they are (--format argv)
        print(f"note: {note}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``args`` command."""
    p = sub.add_parser("args", help="print the Megatron arguments for a Hugging Face config.json")
    p.add_argument("--hf-config", required=True, metavar="PATH", help="config.json or a directory holding one")
    p.add_argument("--spec", help="model spec name (default: the one serving the config's model_type)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="TP size the padded vocabulary is shown for (default 1)")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--format", choices=("lines", "argv", "json"), default="lines")
    p.add_argument("--check", nargs=argparse.REMAINDER, metavar="FLAG",
                   help="compare these Megatron arguments with the config (put it last)")
    p.set_defaults(func=_cmd_args)
