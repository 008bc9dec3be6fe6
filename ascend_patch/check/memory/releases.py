"""Everything the memory estimate knows that could differ between Megatron-LM releases, in one place.

Checked against the snapshots of core_v0.12.1, core_v0.16.1 and core_v0.17.1: the names below
are the same in all three (``RELEASE_DIFFERENCES`` lists where they are not). This table is
meant to move into the project's one release-difference module.
"""

from __future__ import annotations

__all__ = ["BATCH_KEYS", "DROPPED_FLAGS", "RELEASE_DIFFERENCES", "TEARDOWN", "TRAINING_HOOKS"]

# megatron.training.training names the estimate wraps while pretrain runs
TRAINING_HOOKS: tuple[str, ...] = (
    "setup_model_and_optimizer", "train_step", "build_train_valid_test_data_iterators", "get_num_microbatches",
)  # get_num_microbatches is only read

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

# release -> what differs for the estimate there (empty: nothing known)
RELEASE_DIFFERENCES: dict[str, dict[str, object]] = {
    "0.12": {},
    "0.16": {},
    "0.17": {},
}
