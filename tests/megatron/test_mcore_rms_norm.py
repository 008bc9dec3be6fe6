"""megatron-core's RMSNorm on the target: ``npu_rms_norm`` when the kernel table has it, torch's otherwise.

A reference of the documented ``npu_rms_norm`` semantics (tests/ops/npu_references.py) is injected
into the active backend's kernel table; a stock GPTModel built with ``normalization="RMSNorm"`` must
call it for every norm and give the logits the same weights give with torch's RMSNorm.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops"))

from mcore_run import mcore_world  # noqa: E402,F401  (fixture)
from npu_references import CallLog, reference_npu_rms_norm  # noqa: E402


def _norm_config(**kw):
    base = dict(layernorm_zero_centered_gamma=False, persist_layer_norm=False, sequence_parallel=False,
                memory_efficient_layer_norm=False, normalization="RMSNorm")
    base.update(kw)
    return types.SimpleNamespace(**base)


def _rms(x, w, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _gpt(layers=2):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               ffn_hidden_size=96, normalization="RMSNorm", layernorm_epsilon=1e-6,
                               qk_layernorm=True, use_cpu_initialization=True, hidden_dropout=0.0,
                               attention_dropout=0.0, add_bias_linear=False)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    return GPTModel(config, spec, vocab_size=128, max_sequence_length=32, position_embedding_type="rope")


def _logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    return model(tokens, positions, None)


def test_gpt_model_rms_norms_run_on_npu_rms_norm(mcore_world):
    import ascend_patch
    from ascend_patch.ops.norm_apex import FusedRMSNorm

    backend = ascend_patch.active_backend()
    log = CallLog(reference_npu_rms_norm)
    torch.manual_seed(0)
    plain = _gpt()  # no kernel in the cpu table: torch's RMSNorm
    assert isinstance(plain.decoder.layers[0].input_layernorm, torch.nn.RMSNorm)
    tokens = torch.randint(0, 128, (2, 16))
    with backend.kernels.override(npu_rms_norm=log):
        npu = _gpt()
        norms = {name: m for name, m in npu.named_modules() if "weight" in m._parameters and "layernorm" in name}
        # per layer: input, pre-MLP, q and k norms; plus the final norm
        assert len(norms) == 2 * 4 + 1 and all(isinstance(m, FusedRMSNorm) for m in norms.values()), norms
        assert npu.state_dict().keys() == plain.state_dict().keys()  # same `weight` keys: checkpoints move
        for m in norms.values():
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)  # non-trivial gammas, so a dropped weight shows
        plain.load_state_dict(npu.state_dict(), strict=True)
        out = _logits(npu, tokens)
    assert len(log.calls) == len(norms)  # each norm ran once, on the kernel and all(c["epsilon"] == 1e-6 for c in log.calls)
    torch.testing.assert_close(out, _logits(plain, tokens), rtol=1e-5, atol=1e-5)
    final = norms["decoder.final_layernorm"]
    x = torch.randn(3, 64)
    with backend.kernels.override(npu_rms_norm=log):
        y = final(x)
    torch.testing.assert_close(y.double(), _rms(x, final.weight.detach(), 1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("entry", ["WrappedTorchNorm", "FusedLayerNorm"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_both_norm_entry_points_build_the_kernel_norm(patched, entry, sequence_parallel):
    import ascend_patch
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from ascend_patch.ops.norm_apex import FusedRMSNorm

    cls = WrappedTorchNorm if entry == "WrappedTorchNorm" else FusedLayerNorm
    backend = ascend_patch.active_backend()
    config = _norm_config(sequence_parallel=sequence_parallel)
    log = CallLog(reference_npu_rms_norm)
    x = torch.randn(4, 8)
    with backend.kernels.override(npu_rms_norm=log):
        norm = cls(config, 8, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
        y = norm(x)
    assert isinstance(norm, FusedRMSNorm) and norm.eps == 1e-6 and len(log.calls) == 1
    assert list(norm.state_dict()) == ["weight"]
    assert all(getattr(p, "sequence_parallel", False) is sequence_parallel for p in norm.parameters())
    torch.testing.assert_close(y.double(), _rms(x, norm.weight.detach(), 1e-6), rtol=1e-6, atol=1e-6)
    host = cls(config, 8, eps=1e-6)  # the cpu target's table: torch's RMSNorm
    assert type(host) is torch.nn.RMSNorm and list(host.state_dict()) == ["weight"]
    assert all(getattr(p, "sequence_parallel", False) is sequence_parallel for p in host.parameters())
