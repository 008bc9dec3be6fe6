"""torchrun (gloo) worker: load converted checkpoints strictly into stock megatron-core GPTModel.

Usage: torchrun --nproc_per_node N mcore_worker.py CASES.json RESULTS.json

For each case every rank joins ``initialize_model_parallel(tp, pp, vpp)`` (extra ranks are
data-parallel replicas), builds the model chunks from a TransformerConfig derived here from
the HF config.json (independently of the converter), loads its own rank file with
``load_state_dict(strict=True)``, and runs a forward. Pipeline stages pass hidden states
with point-to-point sends in megatron-core's chunk order; the last stage gathers the
vocab-parallel logits across TP; rank 0 receives them and compares with the transformers
reference. Results (max |diff| per case, or the error) go to RESULTS.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def _experts(hf: dict) -> int | None:
    return hf.get("num_experts") or hf.get("num_local_experts")


def _moe(hf: dict, ep: int) -> dict:
    """The router and experts, read from config.json by hand (Qwen3-MoE's and Mixtral's names)."""
    if not _experts(hf):
        return {}
    return dict(num_moe_experts=_experts(hf), expert_model_parallel_size=ep,
                moe_ffn_hidden_size=hf.get("moe_intermediate_size") or hf["intermediate_size"],
                moe_router_topk=hf["num_experts_per_tok"],
                moe_router_pre_softmax=not hf.get("norm_topk_prob", True),
                moe_router_load_balancing_type="none", moe_token_dispatcher_type="alltoall")


def _config(hf: dict, tp: int, pp: int, vpp: int, layer_list: list[int] | None = None, ep: int = 1):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads = hf["num_attention_heads"]
    return TransformerConfig(**_moe(hf, ep),
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads, num_query_groups=hf.get("num_key_value_heads", heads),
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=hf["model_type"] == "qwen2", normalization="RMSNorm", layernorm_epsilon=hf["rms_norm_eps"],
        qk_layernorm=hf["model_type"] in ("qwen3", "qwen3_moe"), hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, params_dtype=torch_float(),
        pipeline_dtype=torch_float(),
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False,
        # an uneven split: megatron-core's first/last-stage layer counts (the converter's --num-layer-list)
        num_layers_in_first_pipeline_stage=layer_list[0] if layer_list else None,
        num_layers_in_last_pipeline_stage=layer_list[-1] if layer_list else None,
    )


def torch_float():
    import torch

    return torch.float32


def _theta(hf: dict) -> float:
    rope = hf.get("rope_parameters") or {}
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def run_case(case: dict) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    tp, pp, vpp, ep = case["tp"], case["pp"], case.get("vpp", 1), case.get("ep", 1)
    with open(case["hf_config"]) as f:
        hf = json.load(f)
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                 expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(1234)
    config = _config(hf, tp, pp, vpp, case.get("layer_list"), ep)
    spec = get_gpt_layer_local_spec(num_experts=_experts(hf), moe_grouped_gemm=False,
                                    qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    tied = bool(hf.get("tie_word_embeddings", False))
    chunks = []
    for v in range(vpp):
        vp = v if vpp > 1 else None
        chunks.append(GPTModel(
            config, spec, vocab_size=case["padded_vocab"], max_sequence_length=hf["max_position_embeddings"],
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=tied, position_embedding_type="rope",
            rotary_base=_theta(hf), vp_stage=vp).eval())

    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    if ep > 1:  # Megatron-LM's legacy name: the EP rank appended
        name += f"_{ps.get_expert_model_parallel_rank():03d}"
    with open(os.path.join(case["mg_dir"], "latest_checkpointed_iteration.txt")) as f:
        it = f.read().strip()
    folder = "release" if it == "release" else f"iter_{int(it):07d}"
    path = os.path.join(case["mg_dir"], folder, name, "model_optim_rng.pt")
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(path, map_location="cpu", weights_only=True)
    for v, chunk in enumerate(chunks):
        sd = state["model"] if vpp == 1 else state[f"model{v}"]
        chunk.load_state_dict(sd, strict=True)  # raises on any missing or unexpected key

    data = torch.load(case["inputs"], weights_only=True)
    ids = data["input_ids"]
    b, s = ids.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)
    h = config.hidden_size
    logits = None
    with torch.no_grad():
        for v, chunk in enumerate(chunks):
            first = pp_rank == 0 and v == 0
            last = pp_rank == pp - 1 and v == vpp - 1
            if first:
                out = chunk(ids, pos, None)
            else:
                recv = torch.empty(s, b, h)
                dist.recv(recv, src=ps.get_pipeline_model_parallel_prev_rank())
                chunk.set_input_tensor(recv)
                out = chunk(None, pos, None)
            if last:
                logits = gather_from_tensor_model_parallel_region(out)[..., : case["vocab"]].contiguous()
            else:
                dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())

    # The global rank holding the full logits (last stage, TP rank 0, DP rank 0) sends them to rank 0.
    me = dist.get_rank()
    holder = torch.tensor([me if (logits is not None and tp_rank == 0 and ps.get_data_parallel_rank() == 0) else -1])
    dist.all_reduce(holder, op=dist.ReduceOp.MAX)
    src = int(holder.item())
    result: dict = {}
    if me == 0:
        full = logits if src == 0 else torch.empty(b, s, case["vocab"])
        if src != 0:
            dist.recv(full, src=src)
        ref = data["logits"]
        result = {"max_abs_diff": float((full - ref).abs().max()), "shape": list(full.shape),
                  "ref_scale": float(ref.abs().max())}
    elif me == src:
        dist.send(logits, dst=0)
    dist.barrier()
    return result


def main() -> int:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    if os.environ.get("MCORE_WORKER_TRACEBACK_AFTER"):  # debugging hangs: dump every thread's stack
        import faulthandler

        faulthandler.dump_traceback_later(int(os.environ["MCORE_WORKER_TRACEBACK_AFTER"]), exit=True)
    import ascend_patch
    from ascend_patch.config import Settings

    ascend_patch.apply(Settings(device="cpu"))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    with open(cases_path) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case)
        except Exception:
            results[case["name"]] = {"error": traceback.format_exc()}
            print(f"rank {dist.get_rank()} case {case['name']} failed:\n{results[case['name']]['error']}",
                  file=sys.stderr)
            return 1
    if dist.get_rank() == 0:
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
