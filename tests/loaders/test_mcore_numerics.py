"""The final proof: converted checkpoints load strictly into stock megatron-core GPTModel on the cpu
target (torchrun, 4 gloo processes) and give transformers' logits within 1e-4 in fp32.

The loaders conftest's ``mcore_logits`` runs every case of this module and of test_moe_numerics.py
in one torchrun launch (see mcore_numerics.py); the parametrised tests below read its per-case results.
"""

from __future__ import annotations

import pytest

from mcore_numerics import Case, assert_logits_match

CASES = [Case(family, tp, pp) for family in ("qwen3", "llama", "qwen2") for tp, pp in ((1, 1), (2, 1), (1, 2), (2, 2))]
CASES += [Case("qwen3", 1, 2, vpp=2), Case("llama", 2, 2, vpp=2)]  # virtual pipeline: 4 layers -> 1 per chunk
CASES += [Case("mistral", 2, 2)]  # Mistral-style llama variant
CASES += [Case("qwen2", 1, 2, via_mg=True)]  # re-sharded mg(TP2,PP2) -> mg(TP1,PP2), never through HF
CASES += [Case("llama", 2, 2, layer_list=(1, 3))]  # uneven stages: --num-layer-list 1,3


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=str)
def test_logits_match_transformers(mcore_logits, case):
    assert_logits_match(mcore_logits[case.name])
