"""A Hugging Face Qwen3 converted by ``ascend-patch convert`` trains in the example with the
qwen3 spec and the arguments ``ascend-patch args`` prints: its first loss equals transformers'
loss on the same batch (TP1 and TP2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mcore_run import REPO, child_env, run_example

pytestmark = pytest.mark.slow

SEQ, MBS, GBS = 32, 2, 4


def _cli(*args, cwd):
    out = subprocess.run([sys.executable, "-m", "ascend_patch.cli", *args], cwd=cwd, env=child_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_qwen3_first_loss_equals_transformers(tmp_path, tp):
    import transformers

    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        from gpt_data import GPTSamples, load_tokens
    finally:
        sys.path.remove(os.path.join(REPO, "examples"))
    cfg = transformers.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64, tie_word_embeddings=False, rope_theta=10000.0,
                                   rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(cfg).float().eval()
    hf.save_pretrained(tmp_path / "hf")
    _cli("convert", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
         "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", "1",
         "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "mg"), "--params-dtype", "fp32", cwd=tmp_path)
    argv = _cli("args", "--hf-config", str(tmp_path / "hf"), "--format", "argv", cwd=tmp_path).split()
    assert "--qk-layernorm" in argv and "--untie-embeddings-and-output-weights" in argv
    assert argv[-2:] == ["--spec", "qwen3"] and argv[argv.index("--hidden-dropout") + 1] == "0.0"
    losses = run_example(str(tmp_path), tp, *argv, "--tensor-model-parallel-size", str(tp),  # nothing by hand
                         "--load", str(tmp_path / "mg"), "--finetune", "--seq-length", str(SEQ),
                         "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS), "--train-iters", "1",
                         "--no-rope-fusion")
    batch = GPTSamples(load_tokens(None), SEQ).batch(list(range(GBS)))
    with torch.no_grad():
        logits = hf(batch["tokens"]).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch["labels"].reshape(-1)).item()
    assert abs(losses[0]["loss"] - expected) / expected <= 1e-5, (losses[0]["loss"], expected)
