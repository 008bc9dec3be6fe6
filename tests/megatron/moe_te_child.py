"""Child process for test_moe_te: megatron-core's MoE layer built from its TE spec on ascend_patch's
transformer_engine layer (TEGroupedMLP on GroupedLinear, SequentialMLP on TE linears) against the local
SequentialMLP with the same weights, in one process; then both token dispatchers with
--moe-permute-fusion on torch_npu's permutation kernels (references) against the unfused ones.
Prints one RESULT JSON line.

A child because megatron-core decides at its first import whether Transformer Engine exists: in the
pytest process that may have happened without the shim."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import ascend_patch
from ascend_patch.config import Settings

ascend_patch.apply(Settings(device="cpu"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec  # noqa: E402
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.moe.moe_utils import (  # noqa: E402
    clear_aux_losses_tracker,
    get_moe_layer_wise_logging_tracker,
)
from megatron.core.transformer.spec_utils import build_module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

EXPERTS, HIDDEN, FFN = 4, 32, 48


def layer(te: bool, grouped: bool, fusion: bool = False, dispatcher: str = "alltoall", permute_fusion: bool = False):
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=FFN, num_moe_experts=EXPERTS,
        moe_router_topk=2, moe_token_dispatcher_type=dispatcher, moe_grouped_gemm=grouped,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01, add_bias_linear=False,
        gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=fusion,
        moe_permute_fusion=permute_fusion)
    built = build_module(get_moe_module_spec(use_te=te, num_experts=EXPERTS, moe_grouped_gemm=grouped), config=config)
    built.set_layer_number(1)
    return built


def copy_weights(src, dst) -> None:
    dst.router.weight.data.copy_(src.router.weight.data)
    experts = src.experts.local_experts
    if type(dst.experts).__name__ == "TEGroupedMLP":
        for e, expert in enumerate(experts):
            getattr(dst.experts.linear_fc1, f"weight{e}").data.copy_(expert.linear_fc1.weight.data)
            getattr(dst.experts.linear_fc2, f"weight{e}").data.copy_(expert.linear_fc2.weight.data)
    else:
        for mine, theirs in zip(dst.experts.local_experts, experts):
            mine.linear_fc1.weight.data.copy_(theirs.linear_fc1.weight.data)
            mine.linear_fc2.weight.data.copy_(theirs.linear_fc2.weight.data)


def run(module, x):
    clear_aux_losses_tracker()
    x = x.detach().clone().requires_grad_()
    out, _ = module(x)
    out.backward(torch.ones_like(out) / out.numel())
    aux = get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"].clone()
    return [out.detach(), x.grad, aux]


def fc1_grads(module) -> list[torch.Tensor]:
    if type(module.experts).__name__ == "TEGroupedMLP":
        return [getattr(module.experts.linear_fc1, f"weight{e}").grad for e in range(EXPERTS)]
    return [expert.linear_fc1.weight.grad for expert in module.experts.local_experts]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def sharded_keys(module) -> list[str]:
    from megatron.core.dist_checkpointing.mapping import ShardedBase

    found = set()
    for value in module.sharded_state_dict(prefix="mlp.").values():
        if isinstance(value, ShardedBase):
            found.add(value.key)
    return sorted(k for k in found if "_extra_state" not in k)


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(0)
    local = layer(te=False, grouped=False)
    te_grouped, te_sequential = layer(te=True, grouped=True), layer(te=True, grouped=False)
    te_fused = layer(te=True, grouped=True, fusion=True)  # megatron's weighted bias-SwiGLU after the grouped GEMM
    for module in (te_grouped, te_sequential, te_fused):
        copy_weights(local, module)
    x = torch.randn(16, 2, HIDDEN)
    want = run(local, x)
    result = {"experts": {name: type(m.experts).__name__ for name, m in
                          (("grouped", te_grouped), ("sequential", te_sequential))},
              "fc1": type(te_grouped.experts.linear_fc1).__name__,
              "fc1_base": type(te_grouped.experts.linear_fc1).__mro__[1].__module__}
    for name, module in (("grouped", te_grouped), ("sequential", te_sequential), ("fused", te_fused)):
        got = run(module, x)
        result[f"{name}_diff"] = max_diff(got, want)
        result[f"{name}_wgrad_diff"] = max_diff(fc1_grads(module), fc1_grads(local))
    result["aux"] = float(want[2][0])
    result["sharded_keys_equal"] = sharded_keys(te_grouped) == sharded_keys(te_sequential)
    result["sharded_keys"] = sharded_keys(te_grouped)[:6]
    # the npu path: npu_grouped_matmul's documented reference in the kernel table
    spec = importlib.util.spec_from_file_location("refs", sys.argv[1])
    refs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refs)
    log = refs.CallLog(refs.reference_npu_grouped_matmul)
    te_grouped.zero_grad()
    with ascend_patch.active_backend().kernels.override(npu_grouped_matmul=log):
        got = run(te_grouped, x)
    result["npu_diff"] = max_diff(got, want)
    result["npu_group_types"] = [c["group_type"] for c in log.calls]
    # --moe-permute-fusion through megatron's own dispatchers with torch_npu's permutation kernels (references)
    spec = importlib.util.spec_from_file_location("moe_refs", os.path.join(os.path.dirname(sys.argv[1]),
                                                                           "npu_references_moe.py"))
    moe_refs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe_refs)
    permute_log = refs.CallLog(moe_refs.reference_npu_moe_token_permute)
    unpermute_log = refs.CallLog(moe_refs.reference_npu_moe_token_unpermute)
    for dispatcher in ("alltoall", "allgather"):
        plain = layer(te=False, grouped=False, dispatcher=dispatcher)
        fused = layer(te=False, grouped=False, dispatcher=dispatcher, permute_fusion=True)
        copy_weights(local, plain)
        copy_weights(local, fused)
        want_dispatched = run(plain, x)
        with ascend_patch.active_backend().kernels.override(npu_moe_token_permute=permute_log,
                                                            npu_moe_token_unpermute=unpermute_log):
            got_dispatched = run(fused, x)
        result[f"permute_{dispatcher}_diff"] = max_diff(got_dispatched, want_dispatched)
        result[f"permute_{dispatcher}_wgrad_diff"] = max_diff(fc1_grads(fused), fc1_grads(plain))
    result["permute_calls"] = [[list(c["args"][1].shape), str(c["args"][1].dtype), c["num_out_tokens"]]
                               for c in permute_log.calls]
    result["unpermute_calls"] = [[list(c["args"][1].shape), list(c["probs"].shape)] for c in unpermute_log.calls]
    print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
