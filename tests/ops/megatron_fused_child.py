"""Child process for test_ops_megatron: stock megatron-core with its fusion flags on, under ``import ascend_patch``.

Prints one JSON line with what it measured. Run with ASCEND_PATCH_DEVICE=cpu and ASCEND_PATCH_REPORT=1.
"""

from __future__ import annotations

import json
import os

import ascend_patch  # noqa: F401  (applies on torch import)
import torch
import torch.nn.functional as F

# user code touching the Transformer Engine shim first gets the same classes megatron-core then uses
import transformer_engine.pytorch.optimizers as te_optimizers  # noqa: E402

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt import gpt_layer_specs  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402


def build(fused: bool, dtype: torch.dtype) -> GPTModel:
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=True,
        apply_rope_fusion=fused, bias_activation_fusion=fused, masked_softmax_fusion=fused,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, use_cpu_initialization=True,
        attention_dropout=0.0, hidden_dropout=0.0)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    return GPTModel(config, gpt_layer_specs.get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=64,
                    position_embedding_type="rope").to(dtype)


def logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    mask = torch.ones(1, 1, tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
    return model(tokens, pos, mask)


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)  # nccl -> gloo on the cpu target
    parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.fusions import fused_bias_swiglu
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.transformer import mlp

    out: dict = {
        "have_te": gpt_layer_specs.HAVE_TE, "have_apex": gpt_layer_specs.HAVE_APEX,
        "ln_impl": gpt_layer_specs.LNImpl.__module__ + "." + gpt_layer_specs.LNImpl.__name__,
        "rope_fused_is_adapted": rope_utils.fused_apply_rotary_pos_emb.__module__.startswith("ascend_patch"),
        "mlp_swiglu_is_patched": mlp.bias_swiglu_impl is fused_bias_swiglu.bias_swiglu_impl
        and mlp.bias_swiglu_impl.__module__.startswith("ascend_patch"),
        "l2norm": getattr(clip_grads.l2_norm_impl, "__module__", ""),
        "te_shim_class": te_optimizers.FusedAdam.__module__,
    }
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    tokens = torch.randint(0, 128, (2, 32))
    fused, plain = build(True, torch.float32), build(False, torch.float32)
    plain.load_state_dict(fused.state_dict())
    ddp = DistributedDataParallel(fused.config, DistributedDataParallelConfig(), fused)
    a, b = logits(ddp, tokens), logits(plain, tokens)
    out["fp32_max_diff"] = float((a - b).detach().abs().max())
    a.float().sum().backward()
    out["grads_finite"] = all(bool(torch.isfinite(p.main_grad).all()) for p in fused.parameters())

    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0), [ddp])
    out["optimizer"] = type(opt.optimizer).__module__ + "." + type(opt.optimizer).__name__
    before = [p.detach().clone() for p in fused.parameters()]
    ok, grad_norm, _ = opt.step()
    out["step_ok"], out["grad_norm"] = bool(ok), float(grad_norm)
    out["params_moved"] = any(not torch.equal(p0, p) for p0, p in zip(before, fused.parameters()))

    fused16, plain16 = build(True, torch.bfloat16), build(False, torch.bfloat16)
    plain16.load_state_dict(fused16.state_dict())
    out["bf16_max_diff"] = float((logits(fused16, tokens).float() - logits(plain16, tokens).float()).abs().max())
    uses = {u.api: u.calls for u in ascend_patch.report().uses}
    out["uses"] = {k: v for k, v in uses.items() if "megatron" in k}
    print("RESULT " + json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
