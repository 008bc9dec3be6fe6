"""The Megatron-LM names the memory estimate reaches for, as data.

Checked against the snapshots of core_v0.12.1, core_v0.16.1 and core_v0.17.1: they are the same in
all three. A name that differs between releases belongs in ``adaptors/megatron/releases.py`` as a fact.
"""

from __future__ import annotations

__all__ = ["BATCH_KEYS", "DROPPED_FLAGS", "ESTIMATE_SKIPS", "FAKE_SHORTCUTS", "FORMULA_ACTIVATIONS", "FORMULA_MODULE",
           "TEARDOWN", "TRAINING_HOOKS"]

# megatron.training.training names the estimate wraps while pretrain runs
TRAINING_HOOKS: tuple[str, ...] = (
    "setup_model_and_optimizer", "train_step", "build_train_valid_test_data_iterators", "get_num_microbatches",
)  # get_num_microbatches is only read

# Megatron-LM's formula (megatron/training/theoretical_memory_usage.py), for comparison only.
# Activations: the first entry whose function exists and whose condition holds (what
# report_theoretical_memory picks): "sp-selective" = --sequence-parallel with selective recompute.
# 0.12 has no compute_activation_memory_without_sp (its report prints no activation otherwise).
FORMULA_MODULE = "megatron.training.theoretical_memory_usage"
FORMULA_ACTIVATIONS: tuple[tuple[str, str], ...] = (
    ("sp-selective", "compute_activation_memory"),
    ("any", "compute_activation_memory_without_sp"),
)

# (module, function) the estimate replaces with a no-op: work for the data pipeline it does not run
# (_compile_dependencies builds megatron-core's dataset helpers with make, g++ and pybind11 on rank 0
# when the launch's Megatron-LM carries megatron/core as source)
ESTIMATE_SKIPS: tuple[tuple[str, str], ...] = (("megatron.training.initialize", "_compile_dependencies"),)

# (module, function) the estimate runs as its allocations alone on fake tensors (.shortcuts has one function
# of each name): the module is where the caller looks the name up (token_dispatcher imports it from moe_utils)
FAKE_SHORTCUTS: tuple[tuple[str, str], ...] = (
    ("megatron.core.transformer.moe.token_dispatcher", "sort_chunks_by_idxs"),
)

# What megatron.core.datasets.gpt_dataset.GPTDataset yields per sample (key, torch dtype); the
# attention mask ([1, s, s] bool) only with --create-attention-mask-in-dataloader (the default)
BATCH_KEYS: tuple[tuple[str, str], ...] = (
    ("tokens", "int64"), ("labels", "int64"), ("attention_mask", "bool"), ("loss_mask", "float32"),
    ("position_ids", "int64"),
)

# (module, function) that forget one pretrain's globals; run in this order between roles
TEARDOWN: tuple[tuple[str, str], ...] = (
    ("megatron.training.global_vars", "unset_global_variables"),
    ("megatron.core.num_microbatches_calculator", "destroy_num_microbatches_calculator"),
    ("megatron.core.rerun_state_machine", "destroy_rerun_state_machine"),
    ("megatron.core.parallel_state", "destroy_model_parallel"),
)

# Launch flags the estimate drops (with the number of values each takes): they read or write
# files that are not on this machine, or would make the two measured iterations do other work
DROPPED_FLAGS: dict[str, int] = {
    "load": 1, "save": 1, "pretrained-checkpoint": 1, "save-interval": 1, "tensorboard-dir": 1,
    "wandb-project": 1, "wandb-exp-name": 1, "wandb-save-dir": 1, "exit-interval": 1,
    "exit-duration-in-mins": 1, "rampup-batch-size": 3, "train-samples": 1, "lr-decay-samples": 1,
    "lr-warmup-samples": 1, "lr-wsd-decay-samples": 1, "profile": 0, "use-pytorch-profiler": 0,
    "record-memory-history": 0, "eval-iters": 1, "eval-interval": 1, "train-iters": 1,
}
