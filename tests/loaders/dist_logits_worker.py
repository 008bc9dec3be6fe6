"""One process (gloo, world 1): megatron-core loads torch_dist checkpoints itself and runs a forward.

Usage: python dist_logits_worker.py HF_CONFIG_DIR TOKENS.pt OUT.pt CKPT_ITER_DIR [CKPT_ITER_DIR ...]

For each checkpoint folder (``iter_XXXXXXX`` holding ``.metadata``) a TP 1 / PP 1 GPTModel
(megatron-core's local spec, SequentialMLP experts for an MoE model, config from the HF config.json,
independent of the converter)
gets ``dist_checkpointing.load(model.sharded_state_dict(), folder)`` — megatron-core's own
re-sharding loader, strict about missing keys — and its logits over the padded vocabulary for
TOKENS (``input_ids`` [1, S]) are saved to OUT.pt as a list, in argument order.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import ascend_patch
    from ascend_patch.config import Settings

    ascend_patch.apply(Settings(device="cpu"))
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mcore_worker import _config, _experts, _theta

    hf_dir, tokens, out_path, *ckpts = sys.argv[1:]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf = json.load(f)
    config = _config(hf, 1, 1, 1)
    ids = torch.load(tokens, weights_only=True)["input_ids"]
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    results = []
    for ckpt in ckpts:
        metadata = dist_checkpointing.load_tensors_metadata(ckpt)
        padded = int(metadata["embedding.word_embeddings.weight"].global_shape[0])
        spec = get_gpt_layer_local_spec(num_experts=_experts(hf), moe_grouped_gemm=False,
                                        qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
        model = GPTModel(config, spec,
                         vocab_size=padded, max_sequence_length=hf["max_position_embeddings"],
                         share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
                         position_embedding_type="rope", rotary_base=_theta(hf)).eval()
        sharded = model.sharded_state_dict()
        # megatron-core's local spec names an MoE layer's pre-MLP norm as if fused into fc1 (its keys map);
        # a checkpoint the TE spec saved holds it as pre_mlp_layernorm: ask for the name the checkpoint has
        for sh in sharded.values():
            if sh.key == "decoder.layers.mlp.linear_fc1.layer_norm_weight" and sh.key not in metadata:
                sh.key = "decoder.layers.pre_mlp_layernorm.weight"
        state = dist_checkpointing.load(sharded, ckpt)  # the model's keys, and common.pt's entries
        model.load_state_dict({k: v for k, v in state.items() if k in sharded}, strict=True)
        with torch.no_grad():
            results.append(model(ids, pos, None)[0].contiguous())
    torch.save(results, out_path)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
