"""Time per training step of a tiny megatron-core GPT on the cpu target: ascend_patch vs by hand.

Two ways to run the same step of the same model (megatron-core GPTModel, local spec, DDP,
the Megatron Adam optimizer with gradient clipping, ``get_forward_backward_func``, fp32):

* ``ascend_patch``: the code written for CUDA (``"cuda"`` devices, ``nccl``) under
  ``ascend_patch.apply()`` — every patch of every plugin is active;
* ``by hand``: the code edited for the host (``"cpu"``, ``gloo``) plus the minimum set of
  monkeypatches megatron-core needs to take this step on a machine without CUDA (listed in
  :func:`patch_by_hand`, found by running it until it stopped failing).

Each mode runs in its own process (so one's patches never touch the other), alternating,
several times; the figure per mode is the median step time over all its timed steps.
Both run megatron's jit functions eagerly (ascend_patch's choice on cpu), so the overhead
figure is the patch layer's cost, not torch.compile's. A third mode, ``by hand,
torch.compile``, keeps megatron's compiled fusions, to show what that choice costs per step
and saves at the first step.

    python benchmarks/megatron_step.py [--reps 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# by_hand_compiled keeps megatron's torch.compile'd fusions: the cost of ascend_patch's jit choice
MODES = ("ascend_patch", "by_hand", "by_hand_compiled")
REPO = os.path.dirname(HERE)


def patch_by_hand() -> None:
    """The minimum monkeypatches for this step without CUDA (what a user would write by hand).

    megatron's jit functions are made eager by ``TORCHDYNAMO_DISABLE=1`` in the environment
    (set by the parent): ``import megatron.core.jit`` already imports the fusions, so setting
    ``jit_fuser`` by hand comes too late.
    """
    import torch

    cpu = torch.device("cpu")
    torch.cuda.current_device = lambda: cpu  # ~60 sites pass it as device=
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._set_cuda_rng_state = lambda state, device=-1, graph_safe=False: torch.set_rng_state(state)
    mrandom._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    import logging  # one generator on the host: the tracker's CPU-RNG warning fires at every dropout

    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    # literal device="cuda" in megatron-core's optimizer and gradient clipping
    for name in ("tensor", "zeros", "ones"):  # the ones this step reaches
        original = getattr(torch, name)

        def on_host(*args, _original=original, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = cpu
            return _original(*args, **kwargs)

        setattr(torch, name, on_host)
    type_of = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):  # Megatron compares CUDA type names
        if dtype is None:
            return type_of(self).replace("torch.", "torch.cuda.", 1)
        return type_of(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_


def child(mode: str, steps: int, warmup: int) -> dict:
    if mode == "ascend_patch":
        import ascend_patch
        from ascend_patch.config import Settings

        ascend_patch.apply(Settings(device="cpu"))
        device, backend = "cuda", "nccl"
    else:  # by_hand, by_hand_compiled
        patch_by_hand()
        device, backend = "cpu", "gloo"
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(num_layers=4, hidden_size=128, num_attention_heads=4, ffn_hidden_size=512,
                               hidden_dropout=0.1, attention_dropout=0.1, use_cpu_initialization=True,
                               bias_activation_fusion=True, bias_dropout_fusion=True, masked_softmax_fusion=True,
                               gradient_accumulation_fusion=False, apply_rope_fusion=False)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=256, max_sequence_length=128)
    model = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model.to(device))
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-3, clip_grad=1.0), [model])
    config.finalize_model_grads_func = finalize_model_grads
    seq, mbs, micro = 128, 4, 2
    data = torch.randint(0, 256, (steps + warmup, micro, mbs, seq + 1))
    positions = torch.arange(seq).expand(mbs, seq).to(device)

    def forward_step(iterator, model):
        batch = next(iterator).to(device)
        out = model(batch[:, :-1], positions, None, labels=batch[:, 1:])
        return out, lambda o: (o.float().mean(), {"loss": o.detach().float().mean()})

    forward_backward = get_forward_backward_func()
    times = []
    first = None
    profiler = None
    if os.environ.get("MEGATRON_STEP_PROFILE"):  # where the time goes, to stderr
        import cProfile

        profiler = cProfile.Profile()
    for step in range(steps + warmup):
        if profiler is not None and step == warmup:
            profiler.enable()
        start = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=iter(data[step]), model=[model],
                                  num_microbatches=micro, seq_length=seq, micro_batch_size=mbs)
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
        elif step == 0:
            first = time.perf_counter() - start
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(os.environ.get("MEGATRON_STEP_PROFILE_FILTER", ""), 30)
    dist.destroy_process_group()
    return {"mode": mode, "times": times, "first": first, "loss": float(losses[-1]["loss"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="processes per mode, alternating")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(child(args.child, args.steps, args.warmup)))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}
    env.update(ASCEND_PATCH="0", PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=str(args.threads))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    firsts: dict[str, list[float]] = {m: [] for m in MODES}
    losses: dict[str, float] = {}
    port = 29400 + os.getpid() % 500
    for rep in range(args.reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            env["MASTER_PORT"] = str(port)
            port += 1
            env.pop("TORCHDYNAMO_DISABLE", None)
            if mode == "by_hand":
                env["TORCHDYNAMO_DISABLE"] = "1"
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                                  "--warmup", str(args.warmup), "--threads", str(args.threads)],
                                 env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{out.stderr[-4000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            times[mode] += result["times"]
            firsts[mode].append(result["first"])
            losses[mode] = result["loss"]
    median = {m: statistics.median(times[m]) for m in MODES}
    print(f"tiny GPT (4 layers, hidden 128, seq 128, 2 x 4 samples per step, fp32, {args.threads} thread(s)); "
          f"{args.reps} processes x {args.steps} steps per mode (median step; first step includes compiling)")
    shown = {"ascend_patch": "ascend_patch", "by_hand": "by hand (eager)",
             "by_hand_compiled": "by hand, torch.compile"}
    for m in MODES:
        print(f"  {shown[m]:24s}: {median[m] * 1e3:8.2f} ms/step   first step {statistics.median(firsts[m]):7.2f} s"
              f"   last loss {losses[m]:.6f}")
    print(f"  overhead of ascend_patch over the eager by-hand patches: "
          f"{(median['ascend_patch'] / median['by_hand'] - 1) * 100:+.2f}%  (goal <= 2%)")

if __name__ == "__main__":
    main()
