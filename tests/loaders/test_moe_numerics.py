"""Converted MoE checkpoints load strictly into stock megatron-core (local spec, SequentialMLP experts,
EP 2, the alltoall dispatcher over gloo) and give transformers' logits within 1e-4 in fp32.

One torchrun launch with 4 processes runs both cases (see mcore_worker.py: the TransformerConfig
is read from config.json by hand, independently of the converter; each rank loads its own
``mp_rank_TT[_PPP]_EEE`` file with ``load_state_dict(strict=True)``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from ascend_patch.models.vocab import padded_vocab_size
from helpers import free_port
from loaders_tiny import child_env, reference_logits

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcore_worker.py")
TOL = 1e-4
# (family, TP, PP, EP) on 4 ranks: TP2 x EP2 (expert-TP 2) and PP2 x EP2 (DP 2 in the dense layout)
CASES = [("qwen3_moe", 2, 1, 2), ("mixtral", 1, 2, 2)]


def _name(case):
    return "-".join(map(str, case))


@pytest.fixture(scope="module")
def results(tmp_path_factory, hf_checkpoint):
    root = tmp_path_factory.mktemp("mcore_moe")
    cases = []
    for case in CASES:
        family, tp, pp, ep = case
        hf, model = hf_checkpoint(family)
        inputs = root / f"{family}_inputs.pt"
        ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(7))
        torch.save({"input_ids": ids, "logits": reference_logits(model, ids)}, inputs)
        mg = str(root / _name(case))
        convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=tp, target_pp=pp, target_ep=ep))
        cases.append(dict(name=_name(case), tp=tp, pp=pp, ep=ep, vpp=1, mg_dir=mg, hf_config=f"{hf}/config.json",
                          inputs=str(inputs), padded_vocab=padded_vocab_size(300, 128, tp), vocab=300))
    with open(root / "cases.json", "w") as f:
        json.dump(cases, f)
    out = root / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port", str(free_port()),
         WORKER, str(root / "cases.json"), str(out)],
        env=child_env(ASCEND_PATCH="0", OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        errors = [line for line in proc.stderr.splitlines() if "failed" in line or "Error" in line]
        pytest.fail(f"torchrun worker failed (rc {proc.returncode}):\n" + "\n".join(errors[-40:]))
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=_name)
def test_moe_logits_match_transformers(results, case):
    got = results[_name(case)]
    assert "error" not in got, got.get("error")
    assert got["shape"] == [2, 12, 300]
    assert got["ref_scale"] > 0.1  # the comparison is not between near-zero tensors
    assert got["max_abs_diff"] < TOL, got
