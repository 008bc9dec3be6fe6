"""``ascend-patch check``: layout, model and checkpoint checked together before launch, all findings at once.

It sits above the converter and the model families: it reads HF configs through the
family specs, Megatron checkpoints through the converter's safe reader and Megatron's
directory layout (:mod:`ascend_patch.loaders.megatron_layout`), and judges the sizes
with :mod:`ascend_patch.parallel`.

* :mod:`.report` — :func:`preflight`: everything the command reports, as data;
* :mod:`.probe` — what layout a checkpoint directory was saved with, without loading weights;
* :mod:`.checkpoint` — whether that checkpoint loads at the launch's layout, and the
  ``ascend-patch convert`` command that re-shards it when not;
* :mod:`.cli` — the command: the rank table, the findings, ``--json``.
"""

from __future__ import annotations

from .checkpoint import checkpoint_findings, convert_command, resharded_dir
from .cli import format_report, register
from .probe import CheckpointLayout, probe_checkpoint
from .report import CheckReport, ModelDims, preflight

__all__ = [
    "CheckReport",
    "CheckpointLayout",
    "ModelDims",
    "checkpoint_findings",
    "convert_command",
    "format_report",
    "preflight",
    "probe_checkpoint",
    "register",
    "resharded_dir",
]
