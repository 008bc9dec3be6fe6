"""Child process for test_mcore_dist_optimizer: a distributed-optimizer resume under ascend_patch.

argv: ORDER MODE STORE_DIR. ORDER "after": megatron-core is imported after the patch (it finds the
transformer_engine shim: TE's FusedAdam, the step in the param groups); "before": imported first (torch's Adam, a
'step' tensor per parameter). MODE "patched", or "no_set_states" / "no_own_steps": that wrapper of
DistributedOptimizer is taken off again (the stock method), to show what it does; "no_grad_only":
the stock ``_set_main_param_and_optimizer_states`` run with autograd off only.
Trains 3 steps, saves the optimizer like Megatron's legacy checkpoint (state_dict() + distrib_optim.pt),
trains 2 more; then a fresh model and optimizer load the step-3 state and train steps 4 and 5.
Prints one line: RESULT {json}.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch

ORDER, MODE, STORE = sys.argv[1], sys.argv[2], sys.argv[3]
if ORDER == "before":
    import megatron.core.optimizer  # noqa: F401  (no apex yet: torch's Adam)

import ascend_patch  # noqa: E402
from ascend_patch.config import Settings  # noqa: E402

ascend_patch.apply(Settings(device="cpu"))

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,  # noqa: E402
                                       finalize_model_grads)
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer import distrib_optimizer  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

DistributedOptimizer = distrib_optimizer.DistributedOptimizer
if MODE != "patched":
    name = "load_state_dict" if MODE == "no_own_steps" else "_set_main_param_and_optimizer_states"
    stock = DistributedOptimizer.__dict__[name].__wrapped__
    if MODE == "no_grad_only":  # the copies with autograd off, but without keeping the restored step
        def set_states(self, model_param, tensors, _stock=stock):
            with torch.no_grad():
                return _stock(self, model_param, tensors)

        stock = set_states
    setattr(DistributedOptimizer, name, stock)

TOKENS = [torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s)) for s in range(5)]


def build():
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                               use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=64, max_sequence_length=16)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=0.0,
                                                 use_distributed_optimizer=True), [ddp])
    return ddp, opt


def step(ddp, opt, tokens):
    ddp.zero_grad_buffer()
    opt.zero_grad()
    positions = torch.arange(16).expand(2, 16)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool).triu(1)
    loss = ddp(tokens, positions, mask, labels=torch.roll(tokens, -1, 1)).float().mean()
    loss.backward()
    finalize_model_grads([ddp])
    ok, _, _ = opt.step()
    assert ok
    return float(loss)


def main():
    dist.init_process_group("nccl", init_method=f"file://{os.path.join(STORE, 'store')}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    out = {"have_apex_or_te": distrib_optimizer.HAVE_APEX_OR_TE}
    ddp, opt = build()
    out["optimizer"] = f"{type(opt.optimizer).__module__}.{type(opt.optimizer).__name__}"
    straight = [step(ddp, opt, TOKENS[i]) for i in range(3)]
    model_state = copy.deepcopy(ddp.module.state_dict())
    optim_state = copy.deepcopy(opt.state_dict())
    path = os.path.join(STORE, "distrib_optim.pt")
    opt.save_parameter_state(path)
    straight += [step(ddp, opt, TOKENS[i]) for i in (3, 4)]
    final = [p.detach().clone() for p in ddp.module.parameters()]

    ddp2, opt2 = build()
    ddp2.module.load_state_dict(model_state)
    try:
        opt2.load_state_dict(optim_state)
        opt2.load_parameter_state(path)
    except Exception as exc:  # what the stock methods do
        out["error"] = f"{type(exc).__name__}: {exc}"
        print("RESULT " + json.dumps(out))
        return
    steps = [float(s["step"]) for s in opt2.optimizer.state.values() if "step" in s]
    out["own_step_tensors"] = len({id(s["step"]) for s in opt2.optimizer.state.values() if "step" in s})
    out["restored_steps"] = sorted(set(steps))
    resumed = [step(ddp2, opt2, TOKENS[i]) for i in (3, 4)]
    out["straight"], out["resumed"] = straight[3:], resumed
    out["max_param_diff"] = max(float((a - b.detach()).abs().max()) for a, b in zip(final, ddp2.module.parameters()))
    out["n_params"] = len(final)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
