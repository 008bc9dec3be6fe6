"""Pretrain a GPT with stock megatron-core, written for CUDA the way Megatron users write it.

Nothing here knows about ascend_patch: ``backend="nccl"``, ``torch.cuda.set_device``,
``.cuda()``, Megatron-LM's flag names and its fusion defaults (all on). On an Ascend
host or on the host CPU it runs unmodified under ascend_patch::

    torchrun --nproc-per-node 2 -m ascend_patch examples/pretrain_gpt.py \
        --tensor-model-parallel-size 2 --sequence-parallel --num-layers 2 --hidden-size 64 \
        --num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 8 \
        --train-iters 20 --save ckpt --save-interval 10

``--spec NAME`` picks a model family registered with ascend_patch (gpt, llama, qwen2,
qwen3, or a third-party plugin); ``--spec module attribute`` is Megatron's form. Without
``--spec`` the stock megatron-core local spec is used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpt_data import VOCAB_SIZE, GPTSamples, load_tokens  # noqa: E402
import gpt_checkpoint  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Pretrain a GPT with megatron-core", allow_abbrev=False)
    a = p.add_argument
    # model
    a("--num-layers", type=int, default=2)
    a("--hidden-size", type=int, default=64)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, default=4)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--kv-channels", type=int, default=None)
    a("--max-position-embeddings", type=int, default=None)
    a("--position-embedding-type", default="learned_absolute", choices=["learned_absolute", "rope", "none"])
    a("--rotary-base", type=int, default=10000)
    a("--rotary-percent", type=float, default=1.0)
    a("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    a("--norm-epsilon", type=float, default=1e-5)
    a("--swiglu", action="store_true")
    a("--disable-bias-linear", action="store_true")
    a("--add-qkv-bias", action="store_true")
    a("--qk-layernorm", action="store_true")
    a("--untie-embeddings-and-output-weights", action="store_true")
    a("--vocab-size", type=int, default=VOCAB_SIZE)
    a("--make-vocab-size-divisible-by", type=int, default=128)
    a("--hidden-dropout", type=float, default=0.1)
    a("--attention-dropout", type=float, default=0.1)
    a("--init-method-std", type=float, default=0.02)
    a("--spec", nargs="*", default=None, help="a registered spec name, or 'module attribute'")
    a("--use-cpu-initialization", action="store_true")
    # fusions: on by default, as in Megatron-LM
    a("--no-masked-softmax-fusion", dest="masked_softmax_fusion", action="store_false")
    a("--no-bias-gelu-fusion", dest="bias_gelu_fusion", action="store_false")
    a("--no-bias-swiglu-fusion", dest="bias_swiglu_fusion", action="store_false")
    a("--no-bias-dropout-fusion", dest="bias_dropout_fusion", action="store_false")
    a("--no-rope-fusion", dest="apply_rope_fusion", action="store_false")
    a("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false")
    a("--no-persist-layer-norm", action="store_true")
    # parallelism
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--context-parallel-size", type=int, default=1)
    a("--sequence-parallel", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    # training
    a("--micro-batch-size", type=int, default=2)
    a("--global-batch-size", type=int, default=None)
    a("--seq-length", type=int, default=64)
    a("--train-iters", type=int, default=10)
    a("--lr", type=float, default=1e-3)
    a("--min-lr", type=float, default=0.0)
    a("--lr-decay-style", default="constant", choices=["constant", "linear", "cosine"])
    a("--lr-warmup-iters", type=int, default=0)
    a("--weight-decay", type=float, default=0.01)
    a("--clip-grad", type=float, default=1.0)
    a("--adam-beta1", type=float, default=0.9)
    a("--adam-beta2", type=float, default=0.999)
    a("--adam-eps", type=float, default=1e-8)
    a("--bf16", action="store_true")
    a("--fp16", action="store_true")
    a("--seed", type=int, default=1234)
    a("--data-path", default=None, help="a UTF-8 text file (default: the generated corpus)")
    a("--log-interval", type=int, default=1)
    a("--loss-log", default=None, help="write one JSON line per iteration (iteration, loss) here")
    # checkpoints (Megatron-LM's layout)
    a("--save", default=None)
    a("--load", default=None)
    a("--save-interval", type=int, default=None)
    a("--ckpt-format", default="torch", choices=["torch"])
    a("--no-load-optim", action="store_true")
    a("--no-load-rng", action="store_true")
    a("--no-save-optim", action="store_true")
    a("--finetune", action="store_true", help="load weights only and start at iteration 0")
    args = p.parse_args(argv)
    args.persist_layer_norm = not args.no_persist_layer_norm
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.kv_channels = args.kv_channels or args.hidden_size // args.num_attention_heads
    args.max_position_embeddings = args.max_position_embeddings or args.seq_length
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    args.add_bias_linear = not args.disable_bias_linear
    args.params_dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    return args


def initialize(args):
    args.rank = int(os.environ.get("RANK", "0"))
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", world_size=args.world_size, rank=args.rank)
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    mpu.initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                                  context_parallel_size=args.context_parallel_size)
    args.data_parallel_size = mpu.get_data_parallel_world_size()
    args.global_batch_size = args.global_batch_size or args.micro_batch_size * args.data_parallel_size
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % per_step:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not a multiple of micro batch "
                         f"{args.micro_batch_size} x data parallel {args.data_parallel_size}")
    args.num_microbatches = args.global_batch_size // per_step
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    args.padded_vocab_size = -(-args.vocab_size // multiple) * multiple
    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed)


def transformer_config(args):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        kv_channels=args.kv_channels, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, normalization=args.normalization,
        layernorm_epsilon=args.norm_epsilon, add_bias_linear=args.add_bias_linear,
        add_qkv_bias=args.add_qkv_bias, gated_linear_unit=args.swiglu,
        activation_func=F.silu if args.swiglu else F.gelu, qk_layernorm=args.qk_layernorm,
        init_method_std=args.init_method_std, use_cpu_initialization=args.use_cpu_initialization,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size, sequence_parallel=args.sequence_parallel,
        bf16=args.bf16, fp16=args.fp16, params_dtype=args.params_dtype, pipeline_dtype=args.params_dtype,
        masked_softmax_fusion=args.masked_softmax_fusion,
        bias_activation_fusion=args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion,
        bias_dropout_fusion=args.bias_dropout_fusion, apply_rope_fusion=args.apply_rope_fusion,
        gradient_accumulation_fusion=args.gradient_accumulation_fusion,
        persist_layer_norm=args.persist_layer_norm, deallocate_pipeline_outputs=True)


def layer_spec(args, config):
    if not args.spec:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        return get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, normalization=args.normalization)
    from megatron.core.transformer.spec_utils import ModuleSpec

    # Megatron's form as two words (--spec mod attr) or one quoted argument (--spec "mod attr")
    parts = args.spec[0].split() if len(args.spec) == 1 else list(args.spec)
    if len(parts) == 2:
        import importlib

        found = getattr(importlib.import_module(parts[0]), parts[1])
    elif len(parts) == 1:  # a name registered by a model-family plugin
        from ascend_patch.models.registry import resolve_spec

        found = resolve_spec(parts[0]).layer_spec
    else:
        raise SystemExit(f"--spec takes a registered name or 'module attribute', got {' '.join(args.spec)!r}")
    return found if isinstance(found, ModuleSpec) else found(config)


def build_model(args, config):
    from megatron.core import parallel_state as mpu
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel

    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec(args, config), vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=mpu.is_pipeline_first_stage(),
        post_process=mpu.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base)
    model.cuda(torch.cuda.current_device())
    if args.bf16 or args.fp16:
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)  # 16-bit params, inputs and outputs, as Megatron-LM wraps it
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=args.use_distributed_optimizer)
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)


def build_optimizer(args, model):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    config = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                             adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                             clip_grad=args.clip_grad, bf16=args.bf16, fp16=args.fp16,
                             params_dtype=args.params_dtype,
                             use_distributed_optimizer=args.use_distributed_optimizer)
    optimizer = get_megatron_optimizer(config, [model])
    samples = max(1, args.train_iters * args.global_batch_size)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0 if args.lr_warmup_iters else args.lr, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * args.global_batch_size, lr_decay_steps=samples,
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=samples, wd_incr_style="constant")
    return optimizer, scheduler


def batches(args, samples, iteration):
    """This rank's micro-batches of one iteration (Megatron's sample order), CP-sliced, on the device."""
    from megatron.core import parallel_state as mpu
    from megatron.core.utils import get_batch_on_this_cp_rank

    dp_rank = mpu.get_data_parallel_rank()
    base = iteration * args.global_batch_size
    for m in range(args.num_microbatches):
        start = base + (m * args.data_parallel_size + dp_rank) * args.micro_batch_size
        batch = samples.batch(list(range(start, start + args.micro_batch_size)))
        batch = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
        yield get_batch_on_this_cp_rank(batch)


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.cat([loss.detach().view(1), num_tokens.float().view(1)])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def reduce_loss(losses):
    """The iteration's mean token loss over the data-parallel (and context-parallel) group."""
    from megatron.core import parallel_state as mpu

    total = torch.zeros(2, dtype=torch.float64, device="cuda")
    for item in losses:
        total += item["lm loss"].double()
    dist.all_reduce(total, group=mpu.get_data_parallel_group(with_context_parallel=True))
    return (total[0] / total[1]).item()


def train(args):
    from megatron.core import parallel_state as mpu
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config = transformer_config(args)
    model = build_model(args, config)
    optimizer, scheduler = build_optimizer(args, model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    config.grad_scale_func = optimizer.scale_loss
    iteration = 0
    if args.load:
        iteration = gpt_checkpoint.load(args, model, optimizer, scheduler)
    samples = GPTSamples(load_tokens(args.data_path), args.seq_length)
    forward_backward = get_forward_backward_func()
    writer = (args.loss_log and mpu.is_pipeline_last_stage() and mpu.get_tensor_model_parallel_rank() == 0
              and mpu.get_data_parallel_rank(with_context_parallel=True) == 0)
    while iteration < args.train_iters:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=forward_step, data_iterator=batches(args, samples, iteration), model=[model],
            num_microbatches=args.num_microbatches, seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size, forward_only=False)
        ok, grad_norm, _ = optimizer.step()
        if ok:
            scheduler.step(increment=args.global_batch_size)
        iteration += 1
        if mpu.is_pipeline_last_stage():
            loss = reduce_loss(losses)
            if writer:
                with open(args.loss_log, "a") as f:
                    f.write(json.dumps({"iteration": iteration, "loss": loss, "grad_norm": grad_norm}) + "\n")
            if iteration % args.log_interval == 0 and mpu.get_tensor_model_parallel_rank() == 0 \
                    and mpu.get_data_parallel_rank(with_context_parallel=True) == 0:
                print(f" iteration {iteration:8d}/{args.train_iters:8d} | lm loss: {loss:.6E} | "
                      f"grad norm: {grad_norm:.3f} | lr: {scheduler.get_lr(optimizer.param_groups[0]):.3E}",
                      flush=True)
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            gpt_checkpoint.save(args, iteration, model, optimizer, scheduler)
    if args.save and (not args.save_interval or iteration % args.save_interval):
        gpt_checkpoint.save(args, iteration, model, optimizer, scheduler)


def main(argv=None):
    args = parse_args(argv)
    initialize(args)
    try:
        train(args)
    finally:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
