"""The launch ``check`` judges: its own flags and the sizes in ``--megatron-args``, which must agree.

A Megatron command line pasted with ``--megatron-args`` says how the job will really run
(``--tensor-model-parallel-size 3 --pipeline-model-parallel-size 8``), and often what the
model is (``--num-layers 28 --num-attention-heads 8``). ``check`` takes both from it; a
size given twice, once as ``check``'s own flag and once in the command line, with two
values is an error (which of them will the job use?).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import Finding

__all__ = ["Launch", "PARALLEL_FLAGS", "MODEL_FLAGS", "launch_from_args"]

# preflight's parameter -> (Megatron-LM's flag, check's own spelling of it)
PARALLEL_FLAGS: dict[str, tuple[str, str]] = {
    "tp": ("tensor-model-parallel-size", "--tensor-model-parallel-size"),
    "pp": ("pipeline-model-parallel-size", "--pipeline-model-parallel-size"),
    "cp": ("context-parallel-size", "--context-parallel-size"),
    "ep": ("expert-model-parallel-size", "--expert-model-parallel-size"),
    "etp": ("expert-tensor-parallel-size", "--expert-tensor-parallel-size"),
    "vpp": ("num-virtual-stages-per-pipeline-rank", "--num-virtual-stages-per-pipeline-rank"),
    "seq_length": ("seq-length", "--seq-length"),
    "first_stage_layers": ("decoder-first-pipeline-num-layers", "--decoder-first-pipeline-num-layers"),
    "last_stage_layers": ("decoder-last-pipeline-num-layers", "--decoder-last-pipeline-num-layers"),
}
# ModelDims field -> Megatron-LM's flag
MODEL_FLAGS: dict[str, str] = {
    "num_layers": "num-layers", "num_attention_heads": "num-attention-heads", "num_query_groups": "num-query-groups",
    "hidden_size": "hidden-size", "ffn_hidden_size": "ffn-hidden-size", "num_experts": "num-experts",
}
_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1}


@dataclass
class Launch:
    """The sizes to check (``values``), the model sizes the command line gives, and what disagreed."""

    values: dict[str, Any]
    sequence_parallel: bool
    model: dict[str, int] = field(default_factory=dict)
    layers_per_virtual_stage: int | None = None
    findings: list[Finding] = field(default_factory=list)


def _int(flag: str, value: Any, findings: list[Finding]) -> int | None:
    try:
        if isinstance(value, bool) or isinstance(value, list):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        shown = "(no value)" if value is True else " ".join(value) if isinstance(value, list) else value
        findings.append(Finding("megatron-args", f"--megatron-args: --{flag} {shown} is not a whole number",
                                "fix the command line"))
        return None


def launch_from_args(given: Mapping[str, Any], sequence_parallel: bool,
                     megatron_args: Sequence[str] | None) -> Launch:
    """``check``'s flags (None = not given) merged with the sizes in ``megatron_args``.

    A size only one side gives is taken from it; one both give with different values is a
    finding, and check's own flag is what the remaining checks use.
    """
    from ..models.args_cli import _parse_argv

    argv = _parse_argv(megatron_args or [])
    launch = Launch(values={}, sequence_parallel=bool(sequence_parallel or argv.get("sequence-parallel") is True))
    for name, (flag, spelling) in PARALLEL_FLAGS.items():
        mine = given.get(name)
        theirs = _int(flag, argv[flag], launch.findings) if flag in argv else None
        if name == "vpp" and theirs is None and "virtual-pipeline-model-parallel-size" in argv:  # the old spelling
            theirs = _int("virtual-pipeline-model-parallel-size", argv["virtual-pipeline-model-parallel-size"],
                          launch.findings)
        if mine is not None and theirs is not None and mine != theirs:
            launch.findings.append(Finding(
                "megatron-args-parallel", f"{spelling} {mine} contradicts --megatron-args, which says --{flag} "
                f"{theirs}", "give each size once: the job runs with what its command line says"))
        value = mine if mine is not None else theirs
        launch.values[name] = value if value is not None else _DEFAULTS.get(name)
    if "num-layers-per-virtual-pipeline-stage" in argv:
        launch.layers_per_virtual_stage = _int("num-layers-per-virtual-pipeline-stage",
                                               argv["num-layers-per-virtual-pipeline-stage"], launch.findings)
    for name, flag in MODEL_FLAGS.items():
        if flag in argv and (name != "num_query_groups" or argv.get("group-query-attention") is True):
            value = _int(flag, argv[flag], launch.findings)
            if value is not None:
                launch.model[name] = value
    return launch
