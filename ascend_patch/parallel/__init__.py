"""Parallel arithmetic, a leaf every layer above uses: sizes, rank order, layer placement, one Layout.

World = TP x PP x CP x DP (and expert-TP x EP x expert-DP x PP for MoE layers);
:class:`Layout` says which rank holds which coordinate and, once a model's layers are
placed, which layers each pipeline stage and virtual chunk holds. The checks
(:mod:`.sizes`, :mod:`.placement`) are the rules megatron-core enforces, worded with the
numbers and the nearest valid choices, and shared by the training adaptor, the
converter and ``ascend-patch check`` (each passes its own flag names,
:class:`ParallelFlags`). Nothing here imports torch or anything above it.
"""

from __future__ import annotations

from .layout import DEFAULT_ORDER, DIMENSIONS, MEGATRON_GROUPS, Layout, LayoutError, RankRow, parse_order, place_layers
from .placement import (
    balanced_layer_list,
    check_layers,
    parse_layer_list,
    stage_layer_ranges,
    stages_from_first_last,
    training_split_flags,
    uneven_split,
)
from .sizes import (
    CONVERT_FLAGS,
    TRAINING_FLAGS,
    ParallelConfigError,
    ParallelFlags,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_query_groups,
    check_seq_length,
    check_sizes,
    check_world_size,
    collect,
    divisors,
    format_choices,
)

__all__ = [
    "CONVERT_FLAGS",
    "DEFAULT_ORDER",
    "DIMENSIONS",
    "Layout",
    "LayoutError",
    "MEGATRON_GROUPS",
    "ParallelConfigError",
    "ParallelFlags",
    "RankRow",
    "TRAINING_FLAGS",
    "balanced_layer_list",
    "check_experts",
    "check_ffn_hidden_size",
    "check_heads",
    "check_layers",
    "check_query_groups",
    "check_seq_length",
    "check_sizes",
    "check_world_size",
    "collect",
    "divisors",
    "format_choices",
    "parse_layer_list",
    "parse_order",
    "place_layers",
    "stage_layer_ranges",
    "stages_from_first_last",
    "training_split_flags",
    "uneven_split",
]
