"""Parse translated command lines with a Megatron-LM snapshot's own ``parse_args`` (run by test_migrate_parser.py).

``python -m ascend_patch migrate_parse_worker.py JOBS OUT`` with the snapshot first on ``PYTHONPATH`` and
``ASCEND_PATCH_DISABLE_PLUGINS=migrate`` (stock's parser, not the translation). JOBS: ``[{"name", "args"}]``;
OUT: per job the parsed fields asked for, or the parser's error.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

FIELDS = ("tokenizer_type", "tokenizer_model", "make_vocab_size_divisible_by", "padded_vocab_size", "num_layers",
          "pipeline_model_parallel_layout", "num_layers_per_virtual_pipeline_stage", "moe_token_dispatcher_type",
          "cp_comm_type", "transformer_impl", "ckpt_format", "qk_layernorm", "spec", "tokenizer_hf_use_fast",
          "enable_gloo_process_groups", "moe_layer_freq", "load", "use_flash_attn", "position_embedding_type")


def main(jobs_path: str, out_path: str) -> None:
    import megatron.core.package_info as info
    from megatron.training.arguments import parse_args

    results = {"release": info.__version__, "jobs": {}}
    for job in json.load(open(jobs_path)):
        sys.argv = ["pretrain_gpt.py", *job["args"]]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parse_args()
            results["jobs"][job["name"]] = {"ok": True, **{f: getattr(ns, f, "<absent>") for f in FIELDS}}
        except SystemExit:
            results["jobs"][job["name"]] = {"ok": False, "error": err.getvalue()[-2000:]}
    with open(out_path, "w") as f:
        json.dump(results, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
