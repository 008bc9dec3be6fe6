"""Converted checkpoints against stock megatron-core: the cases, their preparation, one torchrun launch.

A :class:`Case` names a family and a target layout. :func:`prepare` converts the family's tiny HF
checkpoint to it and saves the transformers reference logits; :func:`launch` runs
``mcore_worker.py`` once on 4 gloo processes over a list of prepared cases (each re-initialises
model parallelism; ranks beyond TP x PP x EP are data-parallel replicas) and returns the worker's
result per case. Every process of a launch pays the torch + megatron-core import once, so the
loaders conftest's ``mcore_logits`` fixture runs all the cases a session's tests ask for in one
launch; :func:`assert_logits_match` is the check each of those tests makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from helpers import child_env, free_port

__all__ = ["Case", "TOL", "WORKER", "assert_logits_match", "cases_of", "launch", "prepare"]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcore_worker.py")
TOL = 1e-4  # fp32 logits: megatron-core and transformers sum in other orders
VOCAB = 300  # loaders_tiny's families: no multiple of 128, so Megatron pads it
SECONDS_PER_CASE = 90  # 19 cases took 19 s with the launch on 2 cores: room for a loaded machine


@dataclass(frozen=True)
class Case:
    """A family converted to ``tp`` x ``pp`` (x ``vpp`` chunks, x ``ep`` expert ranks).

    ``via_mg`` converts through Megatron first (HF -> mg TP2 PP2 -> mg at this layout, never through
    HF again); ``layer_list`` gives an uneven split over the pipeline stages (``--num-layer-list``).
    """

    family: str
    tp: int
    pp: int
    vpp: int = 1
    ep: int = 1
    via_mg: bool = False
    layer_list: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        parts = [self.family, f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"vpp{self.vpp}"] if self.vpp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += ["from-mg-tp2-pp2"] if self.via_mg else []
        parts += ["layers-" + "-".join(map(str, self.layer_list))] if self.layer_list else []
        return "-".join(parts)

    def __str__(self) -> str:  # the test id
        return self.name


def cases_of(items: list[Any]) -> list[Case]:
    """The distinct cases the collected test items are parametrised with, in collection order."""
    found: dict[Case, None] = {}
    for item in items:
        for value in getattr(getattr(item, "callspec", None), "params", {}).values():
            if isinstance(value, Case):
                found[value] = None
    return list(found)


def prepare(case: Case, hf_checkpoint: Callable[[str], tuple[str, Any]], root: Path) -> dict:
    """Convert the family's HF checkpoint to the case's layout; the worker's description of the case."""
    import torch

    from ascend_patch.loaders.engine import convert
    from ascend_patch.loaders.formats import ConvertOptions
    from ascend_patch.models.vocab import padded_vocab_size
    from loaders_tiny import reference_logits

    hf, model = hf_checkpoint(case.family)
    inputs = root / f"{case.family}_inputs.pt"
    if not inputs.exists():
        ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(7))
        torch.save({"input_ids": ids, "logits": reference_logits(model, ids)}, inputs)
    mg = str(root / case.name)
    if case.via_mg:
        convert(hf, mg + "-src", "hf", "mg", ConvertOptions(target_tp=2, target_pp=2))
        convert(mg + "-src", mg, "mg", "mg", ConvertOptions(target_tp=case.tp, target_pp=case.pp))
    else:
        convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=case.tp, target_pp=case.pp, target_vpp=case.vpp,
                                                   target_ep=case.ep, num_layer_list=case.layer_list))
    return dict(name=case.name, tp=case.tp, pp=case.pp, vpp=case.vpp, ep=case.ep, mg_dir=mg,
                hf_config=f"{hf}/config.json", inputs=str(inputs), vocab=VOCAB,
                padded_vocab=padded_vocab_size(VOCAB, 128, case.tp),
                layer_list=list(case.layer_list) if case.layer_list else None)


def launch(cases: list[dict], root: Path, nproc: int = 4) -> dict[str, dict]:
    """Run ``mcore_worker.py`` once over ``cases`` (dicts as :func:`prepare` makes them); name -> result."""
    root = Path(root)
    with open(root / "cases.json", "w") as f:
        json.dump(cases, f)
    out = root / "results.json"
    timeout = 300 + SECONDS_PER_CASE * len(cases)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
         "--master_port", str(free_port()), WORKER, str(root / "cases.json"), str(out)],
        env=child_env(ASCEND_PATCH="0", OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not out.exists():
        errors = [line for line in proc.stderr.splitlines() if "failed" in line or "Error" in line]
        raise AssertionError(f"torchrun mcore_worker.py failed (rc {proc.returncode}) on "
                             f"{[c['name'] for c in cases]}:\n" + "\n".join(errors[-40:]))
    with open(out) as f:
        return json.load(f)


def assert_logits_match(got: dict, vocab: int = VOCAB) -> None:
    """megatron-core's logits for [2, 12] tokens are transformers' within :data:`TOL` (and not near zero)."""
    assert "error" not in got, got.get("error")
    assert got["shape"] == [2, 12, vocab], got
    assert got["ref_scale"] > 0.1, got  # the comparison is not between near-zero tensors
    assert got["max_abs_diff"] < TOL, got
