"""``ascend-patch convert`` and ``ascend-patch verify``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..dtypes import SHORT_NAMES
from ..errors import AscendPatchError
from ..parallel import ParallelConfigError

_CONVERT_HELP = """``ascend-patch convert`` and ``ascend-patch verify``.

``convert`` takes the flags MindSpeed-LLM's ``convert_ckpt.py`` users type
(``--load-model-type hf --save-model-type mg --model-type-hf qwen3
--target-tensor-parallel-size 2 ...``) and Megatron-LM's ``--loader/--saver`` form.
Flags those tools need for their own machinery (``--use-mcore-models``,
``--tokenizer-model``, ``--megatron-path``) are accepted and have no effect here.
"""

__all__ = ["register", "options_from_args", "run_convert", "run_verify", "saver_for"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace(" ", ",").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer counts like 4,6,6,4, got {text!r}") from None


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    io = p.add_argument_group("what to convert")
    io.add_argument("--loader", "--load-model-type", dest="loader", default="hf",
                    help="source format: hf, mg, or a plugin's name (aliases such as qwen3_hf or mcore: "
                    "ascend-patch convert --loader ? lists them)")
    io.add_argument("--saver", "--save-model-type", dest="saver", default="mg",
                    help="target format: hf, mg, or a plugin's name")
    io.add_argument("--load-dir", required=True, help="source checkpoint directory")
    io.add_argument("--save-dir", required=True, help="output directory (must be empty unless --force)")
    io.add_argument("--model-type-hf", help="model family or one of its aliases, e.g. qwen3, qwen2.5, llama3, "
                    "mistral (default: from config.json; ascend-patch doctor lists the families)")
    io.add_argument("--model-type", default="GPT", help="Megatron model type; only GPT is converted")
    io.add_argument("--spec", nargs="+", metavar="SPEC", help="a model spec name (qwen3), or Megatron's 'module attr' "
                    "form; used as the family when --model-type-hf is not given")

    par = p.add_argument_group("target layout (mg)")
    par.add_argument("--target-tensor-parallel-size", type=int, default=1)
    par.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    par.add_argument("--target-expert-parallel-size", type=int, default=1,
                     help="MoE models: expert-parallel ranks the experts are split over (mp_rank_TT[_PPP]_EEE)")
    par.add_argument("--target-expert-tensor-parallel-size", type=int, default=None,
                     help="MoE models: tensor-parallel size inside each expert (default and only value the legacy "
                     "layout holds: the TP size)")
    par.add_argument("--moe-grouped-gemm", action="store_true",
                     help="MoE models with --saver-transformer-impl transformer_engine: TEGroupedMLP keys "
                     "(mlp.experts.linear_fc1.weight0..); default SequentialMLP (mlp.experts.local_experts.N.*)")
    par.add_argument("--virtual-pipeline-parallel-size", "--virtual-pipeline-model-parallel-size", type=int,
                     default=None, dest="vpp", help="model chunks per pipeline rank (interleaved schedule)")
    par.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                     help="layers per virtual chunk (the other way to give the virtual pipeline size)")
    par.add_argument("--num-layer-list", type=_int_list, default=None,
                     help="layers per pipeline stage for an uneven split, e.g. 4,6,6,4")
    par.add_argument("--ckpt-format", default=None, choices=("torch", "torch_dist"),
                     help="mg output format, as Megatron-LM's --ckpt-format names it: torch (legacy, one file per "
                     "rank, loads only at the TP/PP written; the default) or torch_dist (re-sharded on load to any "
                     "TP/PP; --target-tensor-parallel-size then only sets the vocabulary padding)")
    par.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    par.add_argument("--saver-transformer-impl", "--transformer-impl", dest="transformer_impl", default="local",
                     choices=("local", "transformer_engine", "te"),
                     help="key naming of the mg output: megatron-core's local spec (default) or the TE spec that "
                     "Megatron-LM's default --transformer-impl transformer_engine builds (also without Transformer Engine "
                     "installed: ascend_patch's TE-compatible layer serves it)")
    par.add_argument("--loader-transformer-impl", default=None, choices=("local", "transformer_engine", "te"),
                     help="accepted for compatibility; the mg loader reads either naming from the keys")
    par.add_argument("--iteration", type=int, default=None, help="iteration number of the mg output (default 1, or "
                     "the source's for mg -> mg)")

    misc = p.add_argument_group("dtype, vocabulary, output")
    misc.add_argument("--params-dtype", default=None, choices=tuple(SHORT_NAMES),
                      help="dtype of the written tensors (default: the source's)")
    misc.add_argument("--true-vocab-size", "--vocab-size", dest="true_vocab_size", type=int, default=None,
                      help="the unpadded vocabulary, for Megatron checkpoints that do not record it")
    misc.add_argument("--max-shard-size", default="5GB", help="hf output: largest safetensors shard (e.g. 2GB, 500MB)")
    misc.add_argument("--force", action="store_true", help="write into a non-empty --save-dir, replacing what the "
                      "conversion writes there")
    misc.add_argument("--zip-crc", dest="zip_crc", action="store_true", default=True,
                      help="mg output: fill the zip CRC-32 of every record, so tools that test archives (unzip -t, "
                      "zipfile.testzip) accept the files (the default)")
    misc.add_argument("--no-zip-crc", dest="zip_crc", action="store_false",
                      help="mg output: leave the CRC-32 fields 0 (torch.load does not check them; a little faster)")
    misc.add_argument("--workers", type=int, default=0, help="threads writing the output (default: one per core, "
                      "at most 8)")
    misc.add_argument("--verify", action="store_true", help="re-read the output and check it (tensors and key sets)")
    misc.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show the progress bar even when stderr is not a terminal")
    misc.add_argument("--no-progress", dest="progress", action="store_false")
    misc.add_argument("--add-qkv-bias", action="store_true", help="checked against the model config")
    misc.add_argument("--qk-layernorm", action="store_true", help="checked against the model config")
    for flag in ("--use-mcore-models", "--use-mcore"):
        misc.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    misc.add_argument("--tokenizer-model", default=None, help="accepted for compatibility (tokenizers are not converted)")
    misc.add_argument("--megatron-path", default=None, help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> Any:
    from ..models.registry import get_spec_registry
    from .formats import ConvertOptions
    from .hf import parse_size

    family = args.model_type_hf
    if family is None and args.spec:
        words = args.spec if len(args.spec) > 1 else args.spec[0].split()
        guess = words[0] if len(words) == 1 else words[0].rsplit(".", 1)[-1].removesuffix("_spec")
        if get_spec_registry().find(guess) is not None:
            family = guess
    claimed = {"add_qkv_bias": args.add_qkv_bias, "qk_layernorm": args.qk_layernorm} if (
        args.add_qkv_bias or args.qk_layernorm) else {}
    naming = "te" if args.transformer_impl in ("te", "transformer_engine") else "local"
    if args.moe_grouped_gemm:
        naming = "te_grouped" if naming == "te" else naming
    return ConvertOptions(
        target_tp=args.target_tensor_parallel_size, target_pp=args.target_pipeline_parallel_size,
        target_ep=args.target_expert_parallel_size, target_etp=args.target_expert_tensor_parallel_size,
        target_vpp=args.vpp or 1, num_layer_list=args.num_layer_list,
        layers_per_virtual_stage=args.num_layers_per_virtual_pipeline_stage or None,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by, params_dtype=args.params_dtype,
        naming=naming, moe_grouped_gemm=args.moe_grouped_gemm, model_type_hf=family, claimed=claimed,
        true_vocab_size=args.true_vocab_size, max_shard_size=parse_size(args.max_shard_size),
        iteration=args.iteration, zip_crc=args.zip_crc, force=args.force, verify=args.verify,
        progress=args.progress, workers=args.workers)


def run_convert(args: argparse.Namespace) -> int:
    from .engine import Interrupted, convert

    if args.model_type.upper() != "GPT":
        print(f"ascend-patch convert: --model-type {args.model_type} is not supported (only GPT)", file=sys.stderr)
        return 2
    try:
        options = options_from_args(args)
        options = _resolve_vpp(options, args)
        result = convert(args.load_dir, args.save_dir, args.loader, saver_for(args.saver, args.ckpt_format), options)
    except Interrupted as exc:
        print(f"ascend-patch convert: {exc}", file=sys.stderr)
        return 130
    # every error the converter raises on purpose; a ValueError is what the standard library raises on a
    # malformed value in a config or in args (int("x")): the message, not a traceback, is what helps there
    except (AscendPatchError, ValueError) as exc:
        print(f"ascend-patch convert: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system said no (preflight catches the known cases first): exit 1 means
        # a failed verification, so this is a refusal too, and the staging directory is already gone
        print(f"ascend-patch convert: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}; "
              "the partial output was removed", file=sys.stderr)
        return 2
    print(result.summary())
    if result.verify is not None and not result.verify.ok:
        return 1
    return 0


def saver_for(saver: str, ckpt_format: str | None) -> str:
    """The saver ``--save-model-type`` and ``--ckpt-format`` name together (mg + torch_dist -> torch_dist)."""
    if ckpt_format is None:
        return saver
    from .formats import get_format_registry

    registry = get_format_registry()
    chosen = registry.saver(saver)
    if chosen.name not in ("mg", "torch_dist"):
        raise AscendPatchError(f"--ckpt-format {ckpt_format} chooses a Megatron output format, but --save-model-type "
                               f"{saver} writes {chosen.name}; drop --ckpt-format, or use --save-model-type mg")
    return "torch_dist" if ckpt_format == "torch_dist" else "mg"


def _resolve_vpp(options: Any, args: argparse.Namespace) -> Any:
    """--num-layers-per-virtual-pipeline-stage K -> chunks per rank, once the layer count is known."""
    per = options.layers_per_virtual_stage
    if not per:
        return options
    import dataclasses

    from .formats import get_format_registry

    source = get_format_registry().loader(args.loader).open(args.load_dir, options)
    layers, pp = source.config.num_layers, options.target_pp
    if layers % (pp * per):
        raise ParallelConfigError(
            f"{layers} layers cannot be split into chunks of {per} over {pp} pipeline stages", "layers",
            f"valid chunk sizes: {', '.join(str(k) for k in range(1, layers + 1) if layers % (pp * k) == 0)}")
    return dataclasses.replace(options, target_vpp=layers // (pp * per))


def run_verify(args: argparse.Namespace) -> int:
    from .formats import ConvertOptions
    from .verify import verify

    try:
        report = verify(args.load_dir, args.source_dir, loader=args.loader, source_loader=args.source_loader,
                        options=ConvertOptions(model_type_hf=args.model_type_hf,
                                               true_vocab_size=args.true_vocab_size),
                        check_keys=not args.no_keys)
    except (AscendPatchError, ValueError, OSError) as exc:
        print(f"ascend-patch verify: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    conv = sub.add_parser("convert", help="convert checkpoints: Hugging Face <-> Megatron, any TP/PP, streaming",
                          description=_CONVERT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_convert_arguments(conv)
    conv.set_defaults(func=run_convert)

    ver = sub.add_parser("verify", help="re-read a converted checkpoint: tensors against the source, keys against "
                         "megatron-core / transformers")
    ver.add_argument("--load-dir", required=True, help="the checkpoint to verify")
    ver.add_argument("--source-dir", default=None, help="the checkpoint it was converted from")
    ver.add_argument("--loader", default=None, help="format of --load-dir (default: detected)")
    ver.add_argument("--source-loader", default=None, help="format of --source-dir (default: detected)")
    ver.add_argument("--model-type-hf", default=None)
    ver.add_argument("--true-vocab-size", type=int, default=None)
    ver.add_argument("--no-keys", action="store_true", help="skip the key-set check (needs megatron-core)")
    ver.set_defaults(func=run_verify)
