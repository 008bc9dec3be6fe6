"""Converted MoE checkpoints load strictly into stock megatron-core (local spec, SequentialMLP experts,
EP 2, the alltoall dispatcher over gloo) and give transformers' logits within 1e-4 in fp32.

The cases run in the same torchrun launch (4 processes) as test_mcore_numerics.py's (the loaders
conftest's ``mcore_logits``; see mcore_worker.py: the TransformerConfig is read from config.json by
hand, independently of the converter; each rank loads its own ``mp_rank_TT[_PPP]_EEE`` file with
``load_state_dict(strict=True)``).
"""

from __future__ import annotations

import pytest

from mcore_numerics import Case, assert_logits_match

# on 4 ranks: TP2 x EP2 (expert-TP 2) and PP2 x EP2 (DP 2 in the dense layout)
CASES = [Case("qwen3_moe", 2, 1, ep=2), Case("mixtral", 1, 2, ep=2)]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_logits_match_transformers(mcore_logits, case):
    assert_logits_match(mcore_logits[case.name])
