"""Child process for test_te_spec: megatron-core's TE layer spec on ascend_patch's transformer_engine layer
against its local spec, from the same seed, in one process (TP1). Prints one RESULT JSON line."""

from __future__ import annotations

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
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from ascend_patch.loaders.mcore_keys import te_names  # noqa: E402

# TE naming -> local naming: TE fuses the pre-attention / pre-MLP norms into linear_qkv / linear_fc1
RENAME = {"self_attention.linear_qkv.layer_norm_": "input_layernorm.",
          "mlp.linear_fc1.layer_norm_": "pre_mlp_layernorm."}
STYLES = {
    "gpt": dict(),
    "llama": dict(normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, num_query_groups=2,
                  add_bias_linear=False, ffn_hidden_size=96, qk_layernorm=True),
}


def build(style: str, te: bool) -> GPTModel:
    extra = dict(STYLES[style])
    qk = extra.pop("qk_layernorm", False)
    model_parallel_cuda_manual_seed(123)
    torch.manual_seed(123)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                               hidden_dropout=0.0, qk_layernorm=qk, **extra)
    spec = (get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk) if te
            else get_gpt_layer_local_spec(qk_layernorm=qk, normalization=config.normalization))
    return GPTModel(config, spec, vocab_size=128, max_sequence_length=32,
                    position_embedding_type="rope" if style == "llama" else "learned_absolute",
                    share_embeddings_and_output_weights=style == "gpt")


def local_names(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        if key.endswith("_extra_state"):
            continue
        for te_name, local in RENAME.items():
            key = key.replace(te_name, local)
        out[key] = value
    return out


def train(model: GPTModel, tokens: torch.Tensor, labels: torch.Tensor, steps: int = 4) -> list[float]:
    pos = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = model(tokens, pos, None, labels=labels).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    result: dict = {}
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, 128, (2, 32)), torch.randint(0, 128, (2, 32))
    for style in STYLES:
        te_model, local_model = build(style, True), build(style, False)
        te_state, local_state = te_model.state_dict(), local_model.state_dict()
        mapped = local_names(te_state)
        layer = te_model.decoder.layers[0]
        result[style] = {
            "modules": sorted({type(m).__name__ for m in te_model.modules() if type(m).__name__.startswith("TE")}
                              | {type(te_model.decoder.final_layernorm).__module__ + "."
                                 + type(te_model.decoder.final_layernorm).__name__}),
            "qk_norm": type(layer.self_attention.q_layernorm).__module__ + "."
            + type(layer.self_attention.q_layernorm).__name__,
            "extra_state_keys": sorted(k.rsplit(".", 2)[-2] for k in te_state if k.endswith("_extra_state")
                                       and ".layers.0." in k),
            "same_keys": sorted(mapped) == sorted(k for k in local_state if not k.endswith("_extra_state")),
            "only_te": sorted(set(mapped) - set(local_state)),
            "only_local": sorted(set(local_state) - set(mapped)),
            "same_weights": all(torch.equal(mapped[k], local_state[k]) for k in mapped if k in local_state),
            # the converter's TE spelling of the local key set (loaders.mcore_keys.te_names) is what the layer builds
            "converter_te_names": sorted(te_names(dict.fromkeys(local_state))) == sorted(te_state),
            "te_losses": train(te_model, tokens, labels),
            "local_losses": train(local_model, tokens, labels),
        }
    try:
        TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, fp8="hybrid")
        result["fp8_error"] = None
    except Exception as exc:  # noqa: BLE001  (the test checks type and message)
        result["fp8_error"] = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
