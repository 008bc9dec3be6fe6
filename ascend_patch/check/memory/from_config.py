"""A launch line for ``check --memory --hf-config``: the family's Megatron arguments, the layout flags, Megatron-LM's pretrain_gpt.py.

Without a launch line the estimate still needs one to run: the model's arguments come from
``config.json`` as ``ascend-patch args`` prints them, the layout from ``check``'s own flags,
anything else (micro-batch, recompute, precision) from ``--megatron-args``, and the script
from ``--megatron-lm DIR`` (a Megatron-LM checkout; ``MEGATRON_LM_DIR`` when not given).
What had to be assumed is returned as notes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ...errors import FindingError
from .launchline import flag
from .vocab import megatron_version_at, null_tokenizer_vocab_size

__all__ = ["launch_from_config"]


def launch_from_config(hf_config: str, megatron_lm: str | None, nnodes: int, nproc_per_node: int,
                       layout: dict[str, int | None], seq_length: int | None, sequence_parallel: bool,
                       megatron_args: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(launch tokens, notes) for the model in ``hf_config`` at ``layout`` (Megatron flag name -> size)."""
    from ...models.args_cli import model_config_from_path

    root = megatron_lm or os.environ.get("MEGATRON_LM_DIR")
    script = os.path.join(root, "pretrain_gpt.py") if root else None
    if script is None or not os.path.isfile(script):
        raise FindingError(f"no Megatron-LM to run: {script or 'give --megatron-lm DIR'}", "memory-megatron-lm",
                           "give --megatron-lm DIR (a Megatron-LM checkout; the estimate runs its pretrain_gpt.py), "
                           "or the launch line after --")
    mc, spec = model_config_from_path(hf_config)
    argv = [a for a in mc.megatron_argv() if a]
    i = argv.index("--vocab-size")
    argv[i + 1] = str(null_tokenizer_vocab_size(mc.vocab_size, megatron_version_at(root)))
    argv += ["--spec", spec, "--tokenizer-type", "NullTokenizer", "--mock-data", "--lr", "1e-4"]
    for name, value in layout.items():
        if value is not None and flag(megatron_args, name) is None:
            argv += [f"--{name}", str(value)]
    if sequence_parallel and flag(megatron_args, "sequence-parallel") is None:
        argv.append("--sequence-parallel")
    notes = []
    if flag(megatron_args, "seq-length") is None:
        if seq_length is None:
            raise FindingError("the sequence length decides every activation", "memory-seq-length",
                               "give --seq-length (or --seq-length in --megatron-args)")
        argv += ["--seq-length", str(seq_length)]
    if flag(megatron_args, "micro-batch-size") is None:
        argv += ["--micro-batch-size", "1"]
        notes.append("--micro-batch-size 1 (not given)")
    if flag(megatron_args, "bf16") is None and flag(megatron_args, "fp16") is None and "--bf16" not in argv:
        argv.append("--bf16")
        notes.append("--bf16 (no precision given)")
    argv += list(megatron_args)
    tokens = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), script, *argv]
    return tokens, notes
