"""Checkpoints in Megatron-LM's layouts, written with megatron-core only.

Megatron's legacy ("torch") layout, which the converter reads and writes::

    <dir>/latest_checkpointed_iteration.txt
    <dir>/iter_0000010/mp_rank_00[_000]/model_optim_rng.pt   (_PPP only when PP > 1)
    <dir>/iter_0000010/mp_rank_00[_000]/distrib_optim.pt     (distributed optimizer)

``model_optim_rng.pt`` holds ``args`` (the argparse Namespace), ``checkpoint_version``
3.0, ``iteration``, ``model``, ``optimizer``, ``opt_param_scheduler`` and ``rng_state``,
as Megatron-LM writes them. It only loads into the TP/PP layout that saved it.

(megatron-core's ``torch_dist`` format is not offered: its writer needs psutil, which
megatron-core does not declare, and without it the save hangs in a worker process.)
"""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist

__all__ = ["save", "load", "checkpoint_dir", "read_iteration", "unwrap"]

TRACKER = "latest_checkpointed_iteration.txt"


def unwrap(model):
    """The GPTModel inside DistributedDataParallel / Float16Module (what Megatron-LM's unwrap_model does)."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.transformer.module import Float16Module

    while isinstance(model, (DistributedDataParallel, Float16Module)):
        model = model.module
    return model


def checkpoint_dir(root, iteration, tp_rank, pp_rank, pp_size):
    name = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp_size > 1 else "")
    return os.path.join(root, f"iter_{iteration:07d}", name)


def read_iteration(root):
    path = os.path.join(root, TRACKER)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--load {root}: no {TRACKER}; is this a Megatron checkpoint directory?")
    with open(path) as f:
        text = f.read().strip()
    return 0 if text == "release" else int(text), text == "release"


def _rng_state():
    import numpy as np
    from megatron.core import tensor_parallel

    return [{
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state(),
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }]


def _set_rng_state(states):
    import numpy as np
    from megatron.core import tensor_parallel

    state = states[0]
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _saved_args(args, iteration):
    saved = vars(args).copy()
    saved.update(iteration=iteration, consumed_train_samples=iteration * args.global_batch_size,
                 consumed_valid_samples=0, transformer_impl="local", use_legacy_models=False,
                 tokenizer_type="ByteLevel", ckpt_format="torch")
    return type(args)(**saved)


def save(args, iteration, model, optimizer, scheduler):
    """Write iteration ``iteration`` under ``args.save`` and update the tracker file."""
    from megatron.core import parallel_state as mpu

    tp, pp = mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank()
    folder = checkpoint_dir(args.save, iteration, tp, pp, args.pipeline_model_parallel_size)
    writer = mpu.get_data_parallel_rank(with_context_parallel=True) == 0
    if writer:
        os.makedirs(folder, exist_ok=True)
    dist.barrier()
    if args.use_distributed_optimizer and not args.no_save_optim:
        optimizer.save_parameter_state(os.path.join(folder, "distrib_optim.pt"))  # DP rank 0 writes
    if writer:
        state = {"args": _saved_args(args, iteration), "checkpoint_version": 3.0, "iteration": iteration,
                 "model": unwrap(model).state_dict_for_save_checkpoint(), "rng_state": _rng_state()}
        if not args.no_save_optim:
            state["optimizer"] = optimizer.state_dict()
            state["opt_param_scheduler"] = scheduler.state_dict()
        tmp = os.path.join(folder, "model_optim_rng.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, os.path.join(folder, "model_optim_rng.pt"))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(args.save, TRACKER), "w") as f:
            f.write(str(iteration))
        print(f" saved checkpoint at iteration {iteration:8d} to {args.save}", flush=True)
    dist.barrier()


def load(args, model, optimizer, scheduler):
    """Load ``args.load``; returns the iteration to resume from."""
    from megatron.core import parallel_state as mpu

    iteration, release = read_iteration(args.load)
    tp, pp = mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank()
    root = os.path.join(args.load, "release") if release else None
    folder = (os.path.join(root, os.path.basename(checkpoint_dir(args.load, 0, tp, pp, args.pipeline_model_parallel_size)))
              if release else checkpoint_dir(args.load, iteration, tp, pp, args.pipeline_model_parallel_size))
    path = os.path.join(folder, "model_optim_rng.pt")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"--load {args.load}: no {os.path.relpath(path, args.load)} for TP rank {tp}, PP rank {pp}; the "
            "torch format only loads into the TP/PP layout that saved it (re-shard with the converter)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved = state.get("args")
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        if saved is not None and getattr(saved, name, None) != getattr(args, name):
            raise ValueError(f"--load {args.load}: saved with {name}={getattr(saved, name)}, launched with "
                             f"{getattr(args, name)}")
    unwrap(model).load_state_dict(state["model"], strict=True)
    if args.finetune or release:
        return 0
    if not args.no_load_optim:
        optimizer.load_state_dict(state["optimizer"])
        if args.use_distributed_optimizer:
            # megatron-core 0.16 copies into views of leaf parameters here: autograd must be off
            with torch.no_grad():
                optimizer.load_parameter_state(os.path.join(folder, "distrib_optim.pt"))
        scheduler.load_state_dict(state["opt_param_scheduler"])
    if not args.no_load_rng:
        _set_rng_state(state["rng_state"])
    if mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and tp == 0 and pp == 0:
        print(f" loaded checkpoint from {args.load} at iteration {iteration}", flush=True)
    return state["iteration"]

