"""The built-in migration table: MindSpeed-LLM 2.3.0-26.1.0 launch flags -> stock Megatron-LM, per release.

Read from MindSpeed-LLM's and MindSpeed's argument definitions (v2.3.0, v26.1.0 and their
``*_core_r0.12.1`` MindSpeed branches) and stock Megatron-LM's parsers (core_v0.12.1 to 0.17.1).
One :class:`~.rules.FlagRule` per flag and release range; the first rule that matches a flag wins,
so a narrower rule comes before a wider one. A flag no rule names is passed to stock unchanged.
docs/migrating.md's table is generated from this list (``ascend-patch migrate --markdown``).
"""

from __future__ import annotations

from . import compute as c
from .rules import Action, FlagRule

__all__ = ["FLAGS"]

A = Action
SPEED = "speed only, same results: "
MEMORY = "memory only, same results: "
POSTTRAIN = ("MindSpeed-LLM post-training (posttrain_gpt.py: SFT/DPO on its packed instruction datasets "
             "<prefix>_packed_{input_ids,attention_mask,labels}_document, chat templates, LoRA): stock Megatron-LM "
             "has no reader for that data and no LoRA; keep that run on MindSpeed-LLM, or pretrain/continue-train "
             "with pretrain_gpt.py on <prefix>_text_document data")
PREPROCESS = "an option of MindSpeed-LLM's data preprocessing; training reads the preprocessed data and ignores it"
V23 = ">=2.3.0,<26"  # MindSpeed-LLM releases that force --transformer-impl local and --ckpt-format torch


def _rule(flag: str, action: Action, why: str, *to: str, **fields) -> FlagRule:
    return FlagRule(flag, action, why, tuple(to), **fields)


FLAGS: tuple[FlagRule, ...] = (
    # --- the entry point
    _rule("pretrain_gpt.py", A.KEPT, "stock Megatron-LM's GPT pretraining entry point"),
    _rule("posttrain_gpt.py", A.REFUSED, POSTTRAIN),
    # --- tokenizer
    _rule("--tokenizer-type", A.TRANSLATED, "MindSpeed-LLM's name for transformers' AutoTokenizer",
          "--tokenizer-type", "HuggingFaceTokenizer", values=("PretrainedFromHF",)),
    _rule("--tokenizer-type", A.REFUSED, "a MindSpeed-LLM tokenizer class with no stock counterpart; use "
          "HuggingFaceTokenizer with a tokenizer directory that transformers loads", values=("MagistralTokenizer",)),
    _rule("--tokenizer-name-or-path", A.TRANSLATED, "the Hugging Face tokenizer directory", "--tokenizer-model",
          "{value}"),
    _rule("--tokenizer-not-use-fast", A.DROPPED, "this release cannot choose the slow HF tokenizer; pretraining "
          "data is tokenized already, and the tokenizer only gives the vocabulary size and the EOD id, on which "
          "fast and slow agree", megatron="!hf_tokenizer_fast_switch"),
    _rule("--tokenizer-not-use-fast", A.TRANSLATED, "0.16's data-set tokenizer is the slow one unless "
          "--tokenizer-hf-use-fast is given", megatron="tokenizer_hf_use_fast_flag"),
    _rule("--tokenizer-not-use-fast", A.TRANSLATED, "the slow HF tokenizer", "--tokenizer-hf-no-use-fast",
          megatron="tokenizer_hf_no_use_fast_flag"),
    FlagRule("--tokenizer-not-use-fast", A.EXPLICIT, "MindSpeed-LLM's fast HF tokenizer, which 0.16 must be asked "
             "for", ("--tokenizer-hf-use-fast",), megatron="tokenizer_hf_use_fast_flag", absent=True, compute=c.tokenizer_fast_default),
    FlagRule("--padded-vocab-size", A.TRANSLATED, "no --padded-vocab-size here: padding to a multiple of N gives N rows",
             megatron="!padded_vocab_size_flag", compute=c.padded_vocab_divisor),
    _rule("--padded-vocab-size", A.KEPT, "stock builds exactly N embedding rows", megatron="padded_vocab_size_flag"),
    # --- model
    FlagRule("--spec", A.TRANSLATED, "MindSpeed-LLM's qwen3 spec is megatron-core's local layer with q/k RMSNorm: "
             "--spec qwen3 (the same layer with fused attention) where the launch asks for --use-flash-attn and has "
             "no experts, else no --spec; --qk-layernorm either way", values=tuple(c.SPECS), compute=c.spec),
    _rule("--spec", A.REFUSED, "a MindSpeed-LLM layer spec with no entry in the table: stock cannot import it; give "
          "a megatron-core spec (or --spec NAME of an ascend_patch family), or add a rule through the "
          "ascend_patch_migrate_flags hook", values=("mindspeed_llm.*", "mindspeed.*")),
    _rule("--use-mcore-models", A.KEPT, "accepted and ignored: megatron-core models are stock's default"),
    _rule("--use-rotary-position-embeddings", A.KEPT, "stock's older spelling of --position-embedding-type rope"),
    FlagRule("--use-flash-attn", A.DROPPED, "implied where the translated spec has fused attention (MindSpeed-LLM's "
             "dense qwen3 spec -> --spec qwen3), else dropped: megatron-core's local attention is unfused and keeps "
             "every layer's S x S probabilities (memory)", compute=c.flash_attention),
    _rule("--use-fused-swiglu", A.IMPLIED, "stock fuses SwiGLU by default (--no-bias-swiglu-fusion turns it off) "
          "and ascend_patch runs megatron's fused SwiGLU as torch_npu.npu_swiglu"),
    _rule("--use-fused-rmsnorm", A.IMPLIED, "ascend_patch runs megatron-core's RMSNorm as torch_npu.npu_rms_norm"),
    _rule("--use-fused-rotary-pos-emb", A.IMPLIED, "stock fuses RoPE by default (--no-rope-fusion turns it off) and "
          "ascend_patch runs it as torch_npu.npu_rotary_mul"),
    FlagRule("--rope-scaling-type", A.TRANSLATED, "llama3 -> --use-rope-scaling (stock's factors are Llama 3.1's); "
             "other types are refused", compute=c.rope_scaling_type),
    *(FlagRule(flag, A.TRANSLATED, "part of --use-rope-scaling when it equals stock's hard-coded value",
               compute=c.rope_factor)
      for flag in ("--low-freq-factor", "--high-freq-factor", "--original-max-position-embeddings")),
    FlagRule("--transformer-impl", A.TRANSLATED, "2.3.0 builds local layers whatever the flag says",
             ("--transformer-impl", "local"), values=("transformer_engine",), mindspeed_llm=V23),
    _rule("--transformer-impl", A.EXPLICIT, "MindSpeed-LLM 2.3.0 builds megatron-core's local layers; stock's "
          "default is transformer_engine (other module and checkpoint names)", "--transformer-impl", "local",
          absent=True, mindspeed_llm=V23),
    FlagRule("--ckpt-format", A.TRANSLATED, "2.3.0 saves and loads the legacy torch format whatever the flag says",
             ("--ckpt-format", "torch"), values=("torch_dist", "zarr", "torch_dcp"), mindspeed_llm=V23),
    _rule("--ckpt-format", A.EXPLICIT, "MindSpeed-LLM 2.3.0 saves and loads the legacy torch format; stock's default "
          "is torch_dist", "--ckpt-format", "torch", absent=True, mindspeed_llm=V23),
    # --- mixture of experts
    FlagRule("--norm-topk-prob", A.IMPLIED, "stock's top-k gates already sum to 1 (refused with "
             "--moe-router-pre-softmax)", compute=c.norm_topk_prob),
    FlagRule("--first-k-dense-replace", A.TRANSLATED, "the first k layers dense: a --moe-layer-freq list",
             compute=c.first_k_dense_replace),
    _rule("--moe-token-dispatcher-type", A.KEPT, "this release still has alltoall_seq", values=("alltoall_seq",),
          megatron="alltoall_seq_dispatcher"),
    _rule("--moe-token-dispatcher-type", A.TRANSLATED, "alltoall_seq was removed in 0.13; alltoall sends the same "
          "tokens to the same experts (the _seq variant only changed how they travel)", "--moe-token-dispatcher-type",
          "alltoall", values=("alltoall_seq",), megatron="!alltoall_seq_dispatcher"),
    _rule("--moe-intermediate-size", A.TRANSLATED, "MindSpeed-LLM's deprecated spelling", "--moe-ffn-hidden-size",
          "{value}"),
    _rule("--use-fused-moe-token-permute-and-unpermute", A.TRANSLATED, "stock's fused permutation, which ascend_patch "
          "runs as torch_npu.npu_moe_token_permute/unpermute", "--moe-permute-fusion"),
    FlagRule("--moe-alltoall-overlap-comm", A.TRANSLATED, "stock's --overlap-moe-expert-parallel-comm where the launch "
             "meets its conditions, else dropped (speed)", megatron="moe_ep_overlap_flag", compute=c.moe_ep_overlap),
    _rule("--moe-alltoall-overlap-comm", A.DROPPED, SPEED + "the expert all-to-all is not overlapped with compute "
          "(stock has no overlap before 0.14)", megatron="!moe_ep_overlap_flag"),
    _rule("--moe-fb-overlap", A.DROPPED, SPEED + "MindSpeed's overlap of one micro-batch's forward with another's "
          "backward"),
    _rule("--moe-permutation-async-comm", A.DROPPED, SPEED + "the permutation's all-gathers run synchronously"),
    _rule("--gemm-gradient-accumulation-fusion", A.DROPPED, SPEED + "grouped-GEMM weight gradients are accumulated "
          "in a separate step"),
    _rule("--moe-zero-memory", A.DROPPED, MEMORY + "MoE activations are kept instead of recomputed"),
    # --- pipeline and context parallelism
    FlagRule("--noop-layers", A.TRANSLATED, "the real layers, placed as MindSpeed-LLM placed them: "
             "--pipeline-model-parallel-layout", megatron="pipeline_layout_flag", compute=c.layout_flag),
    FlagRule("--noop-layers", A.TRANSLATED, "the real layers, as an uneven first/last stage (refused where this "
             "release cannot place them)", megatron="!pipeline_layout_flag", compute=c.uneven_first_last),
    FlagRule("--num-layer-list", A.TRANSLATED, "layers per stage: --pipeline-model-parallel-layout",
             megatron="pipeline_layout_flag", compute=c.layout_flag),
    FlagRule("--num-layer-list", A.TRANSLATED, "layers per stage as an uneven first/last stage (refused otherwise)",
             megatron="!pipeline_layout_flag", compute=c.uneven_first_last),
    _rule("--context-parallel-algo", A.TRANSLATED, "ring attention", "--cp-comm-type", "p2p",
          values=("megatron_cp_algo",)),
    _rule("--context-parallel-algo", A.TRANSLATED, "Ulysses: heads traded for sequence by all-to-all",
          "--cp-comm-type", "a2a", values=("ulysses_cp_algo",)),
    _rule("--context-parallel-algo", A.TRANSLATED, "K/V all-gathered", "--cp-comm-type", "all_gather",
          values=("kvallgather_cp_algo",)),
    FlagRule("--context-parallel-algo", A.TRANSLATED, "Ulysses inside, ring across: a2a+p2p",
             values=("hybrid_cp_algo",), compute=c.context_parallel_hybrid),
    _rule("--context-parallel-algo", A.REFUSED, "MindSpeed's adaptive CP (a per-batch mask-driven schedule) has no "
          "stock counterpart; use megatron_cp_algo or ulysses_cp_algo",
          values=("adaptive_cp_algo", "hybrid_adaptive_cp_algo")),
    _rule("--ulysses-degree-in-cp", A.DROPPED, "read only by hybrid_cp_algo, which this launch does not use"),
    _rule("--cp-window-size", A.DROPPED, SPEED + "MindSpeed's double-ring window"),
    _rule("--use-cp-send-recv-overlap", A.DROPPED, SPEED + "ring sends are not overlapped with the receives"),
    _rule("--attention-mask-type", A.DROPPED, "stock's mask is causal, as asked", values=("causal",)),
    _rule("--attention-mask-type", A.REFUSED, "a general (dataloader-built) mask has no stock counterpart with CP; "
          "use causal", values=("general",)),
    # --- distributed, optimizer, memory, speed
    FlagRule("--npu-deterministic", A.TRANSLATED, "--deterministic-mode (with NCCL_ALGO for stock's check)",
             compute=c.deterministic),
    FlagRule("--disable-gloo-group", A.TRANSLATED, "--disable-gloo-process-groups, or dropped where stock's legacy "
             "distributed-optimizer checkpoint needs gloo", compute=c.gloo_groups),
    _rule("--distributed-backend", A.KEPT, "nccl: ascend_patch runs hccl on npu (gloo on cpu)"),
    _rule("--reuse-fp32-param", A.DROPPED, MEMORY + "MindSpeed stores the bf16 parameters inside the fp32 master "
          "copies; stock keeps both, about 2 more bytes per parameter on each rank"),
    _rule("--swap-optimizer", A.DROPPED, MEMORY + "the optimizer state stays on the device (stock's "
          "--optimizer-cpu-offload is the nearest, with its own conditions)"),
    _rule("--swap-attention", A.DROPPED, MEMORY + "attention activations stay on the device instead of going to the "
          "host (stock's --recompute-granularity selective saves the same memory by recomputing)"),
    *(_rule(flag, A.DROPPED, SPEED + "TP communication is not overlapped with the matmuls on the NPU (stock's "
            "--tp-comm-overlap needs NVIDIA userbuffers)")
      for flag in ("--use-ascend-coc", "--coc-fused-kernel", "--coc-mode", "--coc-parallel-num", "--use-ascend-mc2")),
    *(_rule(flag, A.DROPPED, SPEED + "tensor parallelism is one-dimensional; the same TP size computes the same")
      for flag in ("--tp-2d", "--tp-x", "--tp-y", "--enable-overlap-ag-with-matmul", "--enable-overlap-matmul-with-rs",
                   "--enable-backward-overlap-ag-with-matmul")),
    _rule("--recompute-activation-function", A.DROPPED, MEMORY + "the activation function's output is kept"),
    _rule("--no-shared-storage", A.DROPPED, "MindSpeed-LLM builds each node's data index itself when nodes share no "
          "file system; stock builds it on rank 0: put the data (or --data-cache-path) on storage every node sees"),
    _rule("--no-pad-to-seq-lengths", A.DROPPED, "instruction data only: pretraining batches are full --seq-length "
          "windows"),
    *(_rule(flag, A.DROPPED, PREPROCESS) for flag in ("--handler-name", "--workers", "--json-keys")),
    # --- checkpoints
    FlagRule("--enable-hf2mg-convert", A.TRANSLATED, "convert the HF --load first (ascend-patch convert), then load "
             "the converted copy", compute=c.hf2mg_convert),
    _rule("--model-type-hf", A.DROPPED, "read only with --enable-hf2mg-convert, which this launch does not give"),
    # --- post-training: refused
    *(_rule(flag, A.REFUSED, POSTTRAIN)
      for flag in ("--stage", "--is-instruction-dataset", "--is-pairwise-dataset", "--prompt-type", "--prompt-type-path",
                   "--neat-pack", "--pack", "--enable-thinking", "--dpo-loss-type", "--lora-r", "--lora-alpha",
                   "--lora-fusion", "--lora-target-modules", "--lora-load", "--pad-to-multiple-of", "--no-shuffle")),
    # --- environment of the launch
    _rule("CUDA_DEVICE_MAX_CONNECTIONS", A.DROPPED, "read by the CUDA driver only; ascend_patch shows Megatron's "
          "checks the value they ask for"),
    _rule("HCCL_*", A.KEPT, "read by HCCL on npu (ignored on cpu)"),
    _rule("PYTORCH_NPU_ALLOC_CONF", A.KEPT, "read by torch_npu's allocator"),
    _rule("TASK_QUEUE_ENABLE", A.KEPT, "read by torch_npu (task queue)"),
    _rule("NPU_ASD_ENABLE", A.KEPT, "read by CANN (silent-data-corruption detection)"),
    _rule("CPU_AFFINITY_CONF", A.KEPT, "read by torch_npu (core binding)"),
    _rule("ASCEND_*", A.KEPT, "read by CANN / torch_npu"),
)
