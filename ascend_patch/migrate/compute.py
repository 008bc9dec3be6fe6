"""The table's rules whose stock form depends on other flags of the launch (layers, TP, the load dir).

Each function is a ``FlagRule.compute``: ``(given, context) -> Outcome | None``. Which releases a
function serves is said by the rule that names it (:mod:`.table`), never here.
"""

from __future__ import annotations

import os
import shlex

from .facts import in_range
from .rules import Action, Context, Given, MigrationError, Outcome

__all__ = [
    "FLASH_SPECS", "SPECS", "context_parallel_hybrid", "deterministic", "first_k_dense_replace", "flash_attention",
    "gloo_groups", "hf2mg_convert",
    "layout_flag", "layout_stages", "moe_ep_overlap", "norm_topk_prob", "padded_vocab_divisor", "rope_factor",
    "rope_scaling_type", "spec", "tokenizer_fast_default", "uneven_first_last",
]

SPECS = {  # MindSpeed-LLM layer specs that megatron-core's local spec builds, and the flags it needs for that
    "mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec": ("--qk-layernorm",),
}
_RESULTS = "dropping it would change the model"


# Layer specs whose layer, with --use-flash-attn, ascend_patch's family spec builds with fused attention
FLASH_SPECS = {"mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec": "qwen3"}


def _flash_family(context: Context) -> str | None:
    """The ascend_patch family spec that builds the launch's (dense) layer with fused attention, if any."""
    given = context.find("--spec")
    if given is None or not context.has("--use-flash-attn") or context.has("--num-experts"):
        return None
    return FLASH_SPECS.get(given.value or "")


def spec(given: Given | None, context: Context) -> Outcome | None:
    """``--spec mindspeed_llm... layer_spec``: ascend_patch's family spec where the launch asks for flash attention
    (dense), else megatron-core's local spec (no ``--spec``) with the flags it needs."""
    assert given is not None and given.value in SPECS
    family = _flash_family(context)
    needed = tuple(flag for flag in SPECS[given.value] if not context.has(flag))
    if family is not None:
        return Outcome(Action.TRANSLATED, ("--spec", family, *needed), (
            f"the same layer as ascend_patch's {family} spec: megatron-core's local modules with q/k RMSNorm "
            "(same state-dict names as the local spec) and the fused attention --use-flash-attn asks for "
            "(npu_fusion_attention; the local spec's attention keeps every layer's S x S probabilities)"))
    return Outcome(Action.TRANSLATED, needed, (
        "the same layer as megatron-core's local spec with q/k RMSNorm, which stock builds from "
        "--transformer-impl local --qk-layernorm (same state-dict names, and --num-experts/--moe-layer-freq "
        "are honoured); under ascend_patch, --spec qwen3 is the same dense layer with npu_fusion_attention"))


def flash_attention(given: Given | None, context: Context) -> Outcome | None:
    """``--use-flash-attn``: implied where the translated spec has fused attention, else dropped with its cost."""
    family = _flash_family(context)
    if family is not None:
        return Outcome(Action.IMPLIED, why=f"--spec {family}'s attention is npu_fusion_attention (see --spec)")
    return Outcome(Action.DROPPED, why=(
        "MindSpeed maps it to torch_npu's fused attention; stock reads it for legacy models only. Memory: "
        "megatron-core's local attention is unfused and keeps each layer's S x S attention probabilities for "
        "every micro-batch in flight, several times the activation memory of MindSpeed-LLM's run at long "
        "sequences (ascend-patch check --memory shows it). For npu_fusion_attention run --transformer-impl "
        "transformer_engine (ascend_patch's TE layer) or an ascend_patch --spec family (--spec qwen3: the same "
        "state-dict names as the local spec)"))


def tokenizer_fast_default(given: Given | None, context: Context) -> Outcome | None:
    """Absent ``--tokenizer-not-use-fast`` means a fast HF tokenizer, which this release must be asked for."""
    if context.value("--tokenizer-type") != "PretrainedFromHF":
        return None
    return Outcome(Action.EXPLICIT, ("--tokenizer-hf-use-fast",), (
        "MindSpeed-LLM loads the fast HF tokenizer unless --tokenizer-not-use-fast; this release's "
        "tokenizer library loads the slow one unless asked (the data-set tokenizer of pretrain_gpt.py)"))


def padded_vocab_divisor(given: Given | None, context: Context) -> Outcome | None:
    """``--padded-vocab-size N`` where stock has no such flag: pad to a multiple of N (N / TP per TP rank)."""
    assert given is not None and given.value is not None
    rows, tp = int(given.value), context.number("--tensor-model-parallel-size", 1)
    if rows % tp:
        return Outcome(Action.REFUSED, why=(
            f"this release pads the vocabulary to a multiple of --make-vocab-size-divisible-by x TP, and "
            f"{rows} rows are not a multiple of TP={tp}: give a --padded-vocab-size divisible by {tp}, or "
            "use megatron-core >= 0.14, which has --padded-vocab-size"))
    divisor = rows // tp
    why = (f"this release has no --padded-vocab-size; it pads the tokenizer's vocabulary up to a multiple of "
           f"divisor x TP = {rows}, which is {rows} rows for any tokenizer of at most {rows} tokens")
    return Outcome(Action.TRANSLATED, ("--make-vocab-size-divisible-by", str(divisor)), why,
                   replaces={"--make-vocab-size-divisible-by": f"replaced by --padded-vocab-size {rows}"})


def _moe_pattern(context: Context, layers: int) -> list[int]:
    freq = context.value("--moe-layer-freq", "1") or "1"
    try:
        step = int(freq)
    except ValueError:
        try:
            pattern = [int(x) for x in eval(freq, {"__builtins__": {}})]  # stock's own form: "([0]*3+[1]*45)"
        except Exception:
            raise MigrationError(f"--moe-layer-freq {freq}: expected an integer or a list expression") from None
        if len(pattern) != layers:
            raise MigrationError(f"--moe-layer-freq {freq} has {len(pattern)} entries for {layers} layers")
        return pattern
    return [1 if i % step == 0 else 0 for i in range(layers)]


def first_k_dense_replace(given: Given | None, context: Context) -> Outcome | None:
    """``--first-k-dense-replace k``: the first k layers dense, as stock's ``--moe-layer-freq`` list."""
    assert given is not None
    k = int(given.value or "0")
    if k <= 0:
        return Outcome(Action.TRANSLATED, (), f"k = {k}: no layer is made dense, nothing to translate")
    layers = context.number("--num-layers", 0)
    pattern = _moe_pattern(context, layers)
    pattern[:k] = [0] * min(k, layers)
    ones = pattern[k:]
    text = f"([0]*{k}+[1]*{layers - k})" if all(ones) else "[" + ",".join(map(str, pattern)) + "]"
    return Outcome(Action.TRANSLATED, ("--moe-layer-freq", text), "the first k layers get a dense MLP",
                   replaces={"--moe-layer-freq": f"folded into --moe-layer-freq with --first-k-dense-replace {k}"}
                   if context.has("--moe-layer-freq") else {})


def layout_stages(context: Context) -> tuple[list[int], int, int]:
    """(real layers per pipeline chunk in layer order, removed layers, chunks per rank) for noop / layer-list flags."""
    layers = context.number("--num-layers", 0)
    pp = context.number("--pipeline-model-parallel-size", 1)
    listed = context.value("--num-layer-list")
    if listed:
        counts = [int(x) for x in listed.split(",")]
        if len(counts) != pp or sum(counts) != layers:
            raise MigrationError(f"--num-layer-list {listed}: needs {pp} counts summing to {layers}")
        return counts, 0, 1
    per_chunk = context.number("--num-layers-per-virtual-pipeline-stage", 0) or (layers // pp if pp else layers)
    if not per_chunk or layers % per_chunk or (layers // per_chunk) % pp:
        raise MigrationError(f"--num-layers {layers} does not split into {pp} stages of "
                             f"{per_chunk}-layer chunks")
    noop = {int(x) for x in (context.value("--noop-layers") or "").split(",") if x.strip()}
    if any(not 0 <= i < layers for i in noop):
        raise MigrationError(f"--noop-layers {context.value('--noop-layers')}: indices must be below {layers}")
    chunks = [per_chunk - sum(1 for i in noop if c * per_chunk <= i < (c + 1) * per_chunk)
              for c in range(layers // per_chunk)]
    return chunks, len(noop), layers // per_chunk // pp


def _layout_text(chunks: list[int]) -> str:
    stages = [("E" if i == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + ("L" if i == len(chunks) - 1 else "")
              for i, n in enumerate(chunks)]
    return "|".join(stages)


def layout_flag(given: Given | None, context: Context) -> Outcome | None:
    """``--noop-layers`` / ``--num-layer-list``: the real layers placed with ``--pipeline-model-parallel-layout``."""
    assert given is not None
    chunks, removed, _ = layout_stages(context)
    layers = context.number("--num-layers", 0)
    replaces = {"--num-layers-per-virtual-pipeline-stage": "folded into --pipeline-model-parallel-layout"}
    to: tuple[str, ...] = ()
    if removed:
        replaces["--num-layers"] = f"{layers} slots minus {removed} noop layers"
        to = ("--num-layers", str(layers - removed))
    if context.number("--pipeline-model-parallel-size", 1) > 1:
        to += ("--pipeline-model-parallel-layout", _layout_text(chunks))
    why = ("noop layers are identity slots that balance the pipeline: stock builds only the real layers, "
           "placed per (virtual) stage as MindSpeed-LLM placed them" if given.flag == "--noop-layers" else
           "layers per pipeline stage, as stock's layout string")
    return Outcome(Action.TRANSLATED, to, why, replaces=replaces)


def uneven_first_last(given: Given | None, context: Context) -> Outcome | None:
    """The same for releases without a layout string: even chunks, or an uneven first and/or last stage."""
    assert given is not None
    chunks, removed, per_rank = layout_stages(context)
    layers = context.number("--num-layers", 0)
    pp = len(chunks) // per_rank
    stages = [sum(chunks[c] for c in range(r, len(chunks), pp)) for r in range(pp)]  # chunk c is on rank c % pp
    to: tuple[str, ...] = ("--num-layers", str(layers - removed)) if removed else ()
    replaces = {"--num-layers": f"{layers} slots minus {removed} noop layers"} if removed else {}
    if len(set(chunks)) == 1:
        if per_rank > 1:
            to += ("--num-layers-per-virtual-pipeline-stage", str(chunks[0]))
            replaces["--num-layers-per-virtual-pipeline-stage"] = "the real layers per virtual stage"
        return Outcome(Action.TRANSLATED, to, "every (virtual) stage keeps the same number of real layers",
                       replaces=replaces)
    middle = set(stages[1:-1])
    if per_rank > 1 or len(middle) > 1:
        return Outcome(Action.REFUSED, why=(
            f"real layers per chunk {chunks}: this release splits a stage's layers evenly over its virtual "
            "chunks and only lets the first and last stage differ; use megatron-core >= 0.13 "
            "(--pipeline-model-parallel-layout), or noop layers that keep that shape"))
    if pp == 2:  # stock divides the rest over the stages left: give one side only
        to += ("--decoder-first-pipeline-num-layers", str(stages[0]))
    else:
        rest = middle.pop()
        for flag, count in (("--decoder-first-pipeline-num-layers", stages[0]),
                            ("--decoder-last-pipeline-num-layers", stages[-1])):
            if count != rest:
                to += (flag, str(count))
    return Outcome(Action.TRANSLATED, to, f"real layers per stage {stages}, as stock's uneven first/last stage",
                   replaces=replaces)


def context_parallel_hybrid(given: Given | None, context: Context) -> Outcome | None:
    """``hybrid_cp_algo``: Ulysses inside groups of ``--ulysses-degree-in-cp``, ring across them."""
    cp = context.number("--context-parallel-size", 1)
    inner = context.number("--ulysses-degree-in-cp", 0)
    if not inner or cp % inner:
        return Outcome(Action.REFUSED, why=(
            f"hybrid CP needs --ulysses-degree-in-cp dividing --context-parallel-size {cp}; give it, or pick "
            "megatron_cp_algo (p2p) / ulysses_cp_algo (a2a)"))
    return Outcome(Action.TRANSLATED, ("--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                                       str(inner), str(cp // inner)),
                   "Ulysses (a2a) inside groups of --ulysses-degree-in-cp ranks, ring (p2p) across them",
                   replaces={"--ulysses-degree-in-cp": "part of --hierarchical-context-parallel-sizes"})


def norm_topk_prob(given: Given | None, context: Context) -> Outcome | None:
    """Renormalised top-k gates: what stock's top-k softmax already gives, unless softmax comes first."""
    if context.has("--moe-router-pre-softmax") and context.value("--moe-router-score-function", "softmax") == \
            "softmax":
        return Outcome(Action.REFUSED, why=(
            "with --moe-router-pre-softmax stock's top-k probabilities are not renormalised and it has no flag "
            f"to do it ({_RESULTS}); remove --moe-router-pre-softmax (a softmax over the top-k logits equals the "
            "renormalised pre-softmax gates)"))
    return Outcome(Action.IMPLIED, (), (
        "stock's router takes the softmax over the top-k logits (or divides top-k sigmoid scores by their "
        "sum), so the gates already sum to 1"))


def moe_ep_overlap(given: Given | None, context: Context) -> Outcome | None:
    """``--moe-alltoall-overlap-comm``: stock's EP overlap where the launch meets its conditions."""
    blockers = [text for text, bad in (
        ("expert parallelism (EP > 1)", context.number("--expert-model-parallel-size", 1) <= 1),
        ("the alltoall/flex dispatcher", context.value("--moe-token-dispatcher-type", "allgather")
         not in ("alltoall", "alltoall_seq", "flex")),
        ("no recomputation", context.has("--recompute-granularity") or context.has("--recompute-method")),
        ("bf16 or fp16", not (context.has("--bf16") or context.has("--fp16"))),
    ) if bad]
    if blockers:
        return Outcome(Action.DROPPED, why=(
            "speed only: the expert all-to-all is not overlapped with compute; stock's "
            f"--overlap-moe-expert-parallel-comm needs {', '.join(blockers)}, which this launch does not have"))
    return Outcome(Action.TRANSLATED, ("--overlap-moe-expert-parallel-comm",),
                   "overlaps the expert all-to-all with compute, as MindSpeed-LLM does")


_STOCK_LLAMA3 = {"--low-freq-factor": "1", "--high-freq-factor": "4", "--original-max-position-embeddings": "8192"}


def rope_scaling_type(given: Given | None, context: Context) -> Outcome | None:
    """``--rope-scaling-type llama3``: stock's ``--use-rope-scaling`` has exactly Llama 3.1's factors."""
    value = given.value if given else None
    if value != "llama3":
        return Outcome(Action.REFUSED, why=(
            f"RoPE scaling '{value}' has no stock implementation (stock has Llama 3.1's only, --use-rope-scaling); "
            f"{_RESULTS}"))
    wrong = [f"{flag} {context.value(flag)}" for flag, stock in _STOCK_LLAMA3.items()
             if context.has(flag) and float(context.value(flag) or 0) != float(stock)]
    if wrong:
        return Outcome(Action.REFUSED, why=(
            f"stock's --use-rope-scaling hard-codes low 1, high 4, original 8192; this launch has {', '.join(wrong)} "
            f"({_RESULTS})"))
    return Outcome(Action.TRANSLATED, ("--use-rope-scaling",),
                   "Llama 3.1 RoPE scaling (stock's factors equal MindSpeed-LLM's; --rope-scaling-factor is stock's)")


def rope_factor(given: Given | None, context: Context) -> Outcome | None:
    """A Llama 3 RoPE factor: part of ``--use-rope-scaling`` when it is stock's hard-coded value."""
    assert given is not None
    stock = _STOCK_LLAMA3[given.flag]
    if context.value("--rope-scaling-type") != "llama3":
        return Outcome(Action.DROPPED, why="read only with --rope-scaling-type llama3, which this launch does not give")
    if float(given.value or 0) != float(stock):
        return Outcome(Action.REFUSED, why=f"stock hard-codes {given.flag} {stock} in --use-rope-scaling ({_RESULTS})")
    return Outcome(Action.TRANSLATED, (), f"stock's --use-rope-scaling uses {stock}")


def hf2mg_convert(given: Given | None, context: Context) -> Outcome | None:
    """``--enable-hf2mg-convert``: MindSpeed-LLM converts the HF ``--load`` at start; stock needs it converted first."""
    load = context.value("--load")
    family = context.value("--model-type-hf")
    if not load or not family:
        return Outcome(Action.REFUSED, why="--enable-hf2mg-convert needs --load (the HF model) and --model-type-hf")
    tp, pp = context.number("--tensor-model-parallel-size", 1), context.number("--pipeline-model-parallel-size", 1)
    ep = context.number("--expert-model-parallel-size", 1)
    cached = f"megatron_cache_tp{tp}pp{pp}ep{ep}"
    theirs = os.path.join(load, cached)  # where MindSpeed-LLM itself converts to (a stock-loadable layout)
    ours = (load.rstrip("/") or load) + "_" + cached  # ascend-patch convert writes outside the source
    done = next((d for d in (theirs, ours) if os.path.isfile(os.path.join(d, "latest_checkpointed_iteration.txt"))),
                None)
    step = ["ascend-patch", "convert", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf",
            family, "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp),
            *(["--target-expert-parallel-size", str(ep)] if ep > 1 else []), "--load-dir", load, "--save-dir", ours]
    target = done or ours
    return Outcome(
        Action.TRANSLATED, ("--load", target),
        "MindSpeed-LLM converts the Hugging Face --load into megatron_cache_tp*pp*ep* at start; stock loads a "
        "Megatron checkpoint: " + (f"{target} holds it" if done else f"ascend-patch convert writes it to {ours} first"),
        replaces={"--load": f"the converted copy of {load}", "--model-type-hf": "names the family to convert"},
        before=() if done else (" ".join(shlex.quote(p) for p in step),))


def deterministic(given: Given | None, context: Context) -> Outcome | None:
    """``--npu-deterministic``: stock's ``--deterministic-mode``, whose checks also ask for ``NCCL_ALGO``."""
    return Outcome(Action.TRANSLATED, ("--deterministic-mode",), (
        "deterministic kernels and reductions; stock's check also wants NCCL_ALGO set (HCCL and gloo do not read "
        "it) and refuses --use-flash-attn and --cross-entropy-loss-fusion"), env={"NCCL_ALGO": "Ring"})


def gloo_groups(given: Given | None, context: Context) -> Outcome | None:
    """``--disable-gloo-group``: stock's flag, unless its legacy distributed-optimizer checkpoint needs gloo."""
    legacy = context.value("--ckpt-format", "torch_dist") == "torch" or (
        not context.has("--ckpt-format") and not in_range(context.mindspeed_llm, ">=26"))
    if context.has("--use-distributed-optimizer") and legacy:
        return Outcome(Action.DROPPED, why=(
            "stock saves the distributed optimizer's state in the legacy torch format by gathering it over gloo "
            "groups, so it keeps them (more host memory and sockets, same results); with --ckpt-format torch_dist "
            "it can drop them (--disable-gloo-process-groups)"))
    return Outcome(Action.TRANSLATED, ("--disable-gloo-process-groups",), "no gloo process groups besides the main ones")
