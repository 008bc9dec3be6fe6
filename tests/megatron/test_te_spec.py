"""megatron-core's Transformer Engine layer spec on ascend_patch's transformer_engine layer (cpu target).

One child process builds GPTModel with ``get_gpt_layer_with_transformer_engine_spec`` and with the
local spec from the same seed - a GPT-style model (LayerNorm, GeLU, biases, learned positions,
tied embeddings) and a llama-style one (RoPE, SwiGLU, RMSNorm, GQA, QK-norm, untied, no bias) - and
trains both for four Adam steps. The same initial weights come from the same seed and init order:
the TE layers draw megatron's model-parallel RNG stream exactly as the local layers do, so no
checkpoint conversion is needed; the test checks that the weights are equal under TE -> local
naming (TE keeps the input norms in linear_qkv / linear_fc1 as ``layer_norm_weight``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import child_env, free_port

CHILD = os.path.join(os.path.dirname(__file__), "te_spec_child.py")


@pytest.fixture(scope="module")
def result():
    proc = subprocess.run([sys.executable, CHILD], capture_output=True, text=True, timeout=600, cwd="/tmp",
                          env=child_env(MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_te_spec_builds_megatrons_te_modules_on_the_layer(result, style):
    r = result[style]
    assert {"TELayerNormColumnParallelLinear", "TERowParallelLinear", "TEDotProductAttention"} <= set(r["modules"])
    norm = "RMSNorm" if style == "llama" else "LayerNorm"
    assert f"transformer_engine.pytorch.module.{norm.lower()}.{norm}" in r["modules"]  # TENorm -> the shim's norm
    if style == "llama":
        assert r["qk_norm"] == "transformer_engine.pytorch.module.rmsnorm.RMSNorm"
    # TE's checkpoint layout: _extra_state on the linears and the core attention
    assert r["extra_state_keys"] == sorted(["core_attention", "linear_proj", "linear_qkv", "linear_fc1",
                                            "linear_fc2"])
    if style == "llama":  # the converter writes TE-spec checkpoints for RMSNorm families: the same key set
        assert r["converter_te_names"]


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_te_spec_trains_like_the_local_spec_from_the_same_seed(result, style):
    r = result[style]
    assert r["same_keys"], (r["only_te"], r["only_local"])
    assert r["same_weights"]
    te, local = r["te_losses"], r["local_losses"]
    assert len(te) == 4 and te[-1] < te[0]
    for a, b in zip(te, local):
        assert abs(a - b) <= 1e-5 * abs(b), (te, local)


def test_fp8_is_refused_when_the_config_is_made(result):
    assert result["fp8_error"].startswith("FP8Unavailable: TransformerConfig.fp8='hybrid' (--fp8-format)")
    assert "the cpu target does not have" in result["fp8_error"] and "--bf16" in result["fp8_error"]
