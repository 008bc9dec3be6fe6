"""The target layout a Megatron saver writes, decided once from the options and the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import canonical as canonical_dtype
from ..errors import Finding
from ..models.vocab import padded_vocab_size
from ..models.weightmap import NAMINGS
from ..parallel import Layout
from .preflight import check_expert_split, check_pipeline_split, check_tensor_split, check_vocab

if TYPE_CHECKING:
    from .formats import ConvertOptions, SourceCheckpoint

__all__ = ["TargetLayout", "target_dtype", "target_iteration", "target_layout"]


@dataclass(frozen=True)
class TargetLayout:
    """What every Megatron output shares: the rank layout, padded vocabulary, dtype, iteration and key naming."""

    layout: Layout
    padded_vocab: int
    dtype: str
    iteration: int | str
    naming: str


def target_dtype(source: SourceCheckpoint, options: ConvertOptions) -> str:
    """``--params-dtype``, else the source's own dtype."""
    return canonical_dtype(options.params_dtype) if options.params_dtype else source.dtype


def target_iteration(source: SourceCheckpoint, options: ConvertOptions) -> int | str:
    """``--iteration``, else a Megatron source's own (``release`` included), else 1."""
    if options.iteration is not None:
        return options.iteration
    if source.format in ("mg", "torch_dist") and source.iteration is not None:
        return source.iteration
    return 1


def target_layout(source: SourceCheckpoint, options: ConvertOptions,
                  per_rank_files: bool = True) -> tuple[TargetLayout | None, list[Finding]]:
    """The layout to write and every problem with it (None when there is one).

    ``per_rank_files``: the legacy format, one file per (TP, PP, EP) rank, so every size
    must fit the model as saved. torch_dist (False) is re-sharded on load: the target TP
    only decides the vocabulary padding (and must still split the heads), EP and expert-TP
    are checked as the training run will use them (any expert-TP), and the layers are
    stored once, stacked (a TP 1 / PP 1 layout).
    """
    cfg = source.config
    tp, ep, naming = options.target_tp, options.target_ep, options.naming
    if per_rank_files:
        problems = check_pipeline_split(cfg.num_layers, options.target_pp, options.target_vpp, options.num_layer_list)
        # an MoE model's dense FFN size (intermediate_size) is not built: its experts' size is checked below
        problems += check_tensor_split(cfg.num_attention_heads, cfg.num_query_groups,
                                       tp if cfg.is_moe else cfg.ffn_hidden_size, tp)
        problems += check_expert_split(cfg.num_experts, cfg.moe_ffn_hidden_size, tp, ep, options.target_etp,
                                       options.moe_grouped_gemm, naming)
        problems += check_vocab(cfg.vocab_size, options.make_vocab_size_divisible_by, tp)
    else:
        problems = check_tensor_split(cfg.num_attention_heads, cfg.num_query_groups, cfg.ffn_hidden_size, tp)
        problems += check_vocab(cfg.vocab_size, options.make_vocab_size_divisible_by, tp)
        problems += [f for f in check_expert_split(cfg.num_experts, cfg.moe_ffn_hidden_size, tp, ep,
                                                   options.target_etp) if f.code != "etp-vs-tp"]
    if naming not in NAMINGS:
        problems.append(Finding("naming", f"unknown key naming {naming!r}", "use local or transformer_engine"))
    if problems:
        return None, problems
    if per_rank_files:
        layout = Layout.build(cfg.num_layers, tp, options.target_pp, options.target_vpp, options.num_layer_list, ep=ep)
    else:
        layout = Layout.build(cfg.num_layers, 1, 1, 1)
    padded = padded_vocab_size(cfg.vocab_size, options.make_vocab_size_divisible_by, tp)
    return TargetLayout(layout, padded, target_dtype(source, options), target_iteration(source, options), naming), []
