"""A stock Hugging Face Trainer script (used by test_hf_trainer.py; nothing here is ascend_patch's).

A tiny GPT-2 built from a config (nothing is downloaded) trains on fixed random tokens
with the command line's TrainingArguments (``--bf16``, batch size, ...). Prints one
``RESULT {json}`` line per process: the logged losses and what Trainer/accelerate chose.
"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


class Losses(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def main():
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(1))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    dtypes = set()
    model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype)))
    losses = Losses()
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[losses])
    trainer.train()
    state = trainer.accelerator.state
    line = "RESULT " + json.dumps({
        "losses": losses.losses, "n_gpu": args.n_gpu, "world": args.world_size,
        "distributed": state.distributed_type.value, "device": str(args.device),
        "mixed_precision": str(state.mixed_precision), "dtypes": sorted(dtypes),
        "rank": int(os.environ.get("RANK", "0"))}) + "\n"
    # Both ranks share torchrun's stdout pipe: a buffered print can reach it in pieces, and the other
    # rank's output then lands inside this line. One write of under PIPE_BUF bytes arrives whole.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())


if __name__ == "__main__":
    main()
