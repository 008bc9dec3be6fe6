"""Every preflight error names the numbers and a remedy."""

from __future__ import annotations

import pytest

from ascend_patch.parallel import (
    CONVERT_FLAGS,
    ParallelConfigError,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_layers,
    check_query_groups,
    check_seq_length,
    check_world_size,
    collect,
    stage_layer_ranges,
    training_split_flags,
    uneven_split,
)


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ParallelConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_layers_over_pipeline_stages():
    assert _message(check_layers, 28, 8, flags=CONVERT_FLAGS) == (
        "28 layers cannot be split over 8 pipeline stages; use --target-pipeline-parallel-size "
        "1, 2, 4, 7, 14 or 28, or give --num-layer-list")
    assert check_layers(28, 4) == [7, 7, 7, 7]
    assert check_layers(28, 8, num_layer_list="4,4,4,4,3,3,3,3") == [4, 4, 4, 4, 3, 3, 3, 3]


def test_layer_list_errors_name_a_remedy():
    assert _message(check_layers, 28, 4, num_layer_list="7,7,7,6", flags=CONVERT_FLAGS) == (
        "--num-layer-list 7,7,7,6 sums to 27 but the model has 28 layers; make the counts add up to 28, "
        "e.g. 7,7,7,7")
    assert _message(check_layers, 28, 4, num_layer_list=[10, 9, 9], flags=CONVERT_FLAGS) == (
        "--num-layer-list 10,9,9 has 3 entries but there are 4 pipeline stages; give one count per stage, "
        "e.g. 7,7,7,7")
    assert _message(check_layers, 28, 8, num_layer_list="14,14,0,0,0,0,0,0", flags=CONVERT_FLAGS) == (
        "--num-layer-list 14,14,0,0,0,0,0,0 gives a stage no layers; every stage needs at least 1, "
        "e.g. 4,4,4,4,3,3,3,3")
    assert _message(check_layers, 3, 4, num_layer_list="1,1,1,0") == (
        "the layer list 1,1,1,0 gives a stage no layers; every stage needs at least 1, and 3 layers cannot "
        "fill 4 stages: use --pipeline-model-parallel-size 1 or 3")
    assert _message(check_layers, 28, 4, vpp=2, num_layer_list="7,7,7,7", flags=CONVERT_FLAGS) == (
        "--num-layer-list 7,7,7,7 cannot be combined with virtual pipeline stages (VPP=2); drop the list "
        "(VPP needs 28 layers divisible by PP x VPP = 8) or drop --virtual-pipeline-parallel-size")
    assert _message(check_layers, 28, 4, num_layer_list="7,x") == (
        "--num-layer-list must be comma-separated integers, got '7,x'; give one count per pipeline stage, "
        "e.g. 7,7,7,7")


def test_loader_side_layer_list_errors_carry_the_remedy():
    # the converter's preflight (loaders/preflight.py) words its problems through check_layers
    from ascend_patch.loaders.preflight import check_pipeline_split

    (p,) = check_pipeline_split(8, 2, num_layer_list=[4, 3])
    assert p.code == "layer-list"
    assert str(p) == "--num-layer-list 4,3 sums to 7 but the model has 8 layers; make the counts add up to 8, e.g. 4,4"
    (p,) = check_pipeline_split(8, 3, num_layer_list=[4, 4])
    assert str(p).endswith("give one count per stage, e.g. 3,3,2")


def test_training_remedy_names_the_flags_megatron_accepts():
    # megatron-core 0.16 has no per-stage list: TransformerConfig.num_layers_in_first/last_pipeline_stage
    # (Megatron-LM --decoder-first/last-pipeline-num-layers) or a pipeline_model_parallel_layout
    msg = _message(check_layers, 28, 8)
    assert msg == ("28 layers cannot be split over 8 pipeline stages; use --pipeline-model-parallel-size "
                   "1, 2, 4, 7, 14 or 28, or split unevenly: --decoder-first-pipeline-num-layers 2 "
                   "--decoder-last-pipeline-num-layers 2 gives 2,4,4,4,4,4,4,2")
    assert "--num-layer-list" not in msg
    assert _message(check_layers, 3, 4) == (
        "3 layers cannot be split over 4 pipeline stages; use --pipeline-model-parallel-size 1 or 3")
    assert uneven_split(24, 5) == [5, 5, 5, 5, 4] and uneven_split(7, 2) == [4, 3] and uneven_split(3, 4) is None
    assert training_split_flags([5, 5, 5, 5, 4]) == "--decoder-last-pipeline-num-layers 4"
    assert training_split_flags([7, 7, 7, 7]) == ""
    assert training_split_flags([4, 4, 4, 4, 3, 3, 3, 3]) == (
        "--pipeline-model-parallel-layout 'Et*4|t*4|t*4|t*4|t*3|t*3|t*3|t*3L'")


def test_training_split_flags_build_the_stages_in_megatron_core():
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    split = uneven_split(28, 8)
    flags = training_split_flags(split).split()
    assert flags[0::2] == ["--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"]
    config = TransformerConfig(num_layers=28, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=8,
                               pipeline_dtype=torch.float32, num_layers_in_first_pipeline_stage=int(flags[1]),
                               num_layers_in_last_pipeline_stage=int(flags[3]))
    assert [get_num_layers_to_build(config, pp_rank=r) for r in range(8)] == split
    stages = [4, 4, 4, 4, 3, 3, 3, 3]
    layout = training_split_flags(stages).split("'")[1]
    built = PipelineParallelLayerLayout(layout, pipeline_model_parallel_size=8)
    built.validate_layer_layout(num_layers=28, mtp_num_layers=None)  # raises AssertionError when wrong
    assert [sum(1 for t in chunk[0] if t.name == "decoder") for chunk in built.layout] == stages


def test_layers_over_virtual_stages():
    msg = _message(check_layers, 24, 4, vpp=4)
    assert "24 layers cannot be split over 4 pipeline stages x 4 virtual stages = 16 chunks" in msg
    assert "--num-virtual-stages-per-pipeline-rank 2, 3 or 6" in msg


def test_stage_layer_ranges_follow_megatron_placement():
    assert stage_layer_ranges(8, 2) == [[range(0, 4)], [range(4, 8)]]
    assert stage_layer_ranges(7, 2, num_layer_list=[4, 3]) == [[range(0, 4)], [range(4, 7)]]
    # interleaved: chunk v of stage p holds v*L/vp + p*L/(PP*vp) + j
    assert stage_layer_ranges(8, 2, vpp=2) == [[range(0, 2), range(4, 6)], [range(2, 4), range(6, 8)]]


def test_world_size():
    msg = _message(check_world_size, 6, tp=2, pp=2)
    assert "world size 6 is not divisible by TP x PP x CP = 2 x 2 x 1 = 4" in msg
    assert "launch 4 or 8 ranks" in msg
    assert "--pipeline-model-parallel-size 1 or 3 (with TP=2, CP=1)" in msg
    assert "--tensor-model-parallel-size 1, 3 or 6 (with PP=2, CP=1)" not in msg  # 6 % (t*2) needs t in 1, 3
    assert "--tensor-model-parallel-size 1 or 3 (with PP=2, CP=1)" in msg
    assert check_world_size(16, tp=2, pp=2, cp=2) == 2
    assert "needs DP = 16 / (2 x 2 x 2) = 2, but DP = 4 was given" in _message(check_world_size, 16, 2, 2, 2, dp=4)
    msg = _message(check_world_size, 8, tp=2, ep=3)
    assert "expert TP x EP x PP = 2 x 3 x 1 = 6" in msg and "--expert-model-parallel-size 1, 2 or 4" in msg
    assert _message(check_world_size, 8, tp=0) == (
        "TP must be a positive integer, got 0; use --tensor-model-parallel-size 1 or more (1 means no tensor "
        "parallelism)")
    assert _message(check_world_size, 8, tp=2, pp=-1, flags=CONVERT_FLAGS) == (
        "PP must be a positive integer, got -1; use --target-pipeline-parallel-size 1 or more (1 means no "
        "pipeline parallelism)")
    assert _message(check_world_size, 8, dp=0).endswith("leave it out to derive it")
    assert _message(check_layers, 0, 2) == (
        "num layers must be a positive integer, got 0; the model config is wrong: fix config.json, or the "
        "--num-layers flag")
    assert _message(check_layers, 8, 2, vpp=0) == (
        "VPP must be a positive integer, got 0; use --num-virtual-stages-per-pipeline-rank 2 or more, or leave "
        "it out for no virtual pipeline stages")


def test_heads_query_groups_ffn_experts():
    assert _message(check_heads, 32, 3) == (
        "32 attention heads cannot be split over 3 tensor-parallel ranks; use --tensor-model-parallel-size "
        "1, 2, 4, 8, 16 or 32")
    assert check_heads(32, 4) == 8
    assert check_query_groups(8, 4) == 2
    assert check_query_groups(2, 8, num_attention_heads=16) == 1  # KV heads replicated (megatron-core 0.16)
    msg = _message(check_query_groups, 4, 3, num_attention_heads=12)
    assert "4 query groups (KV heads) do not fit 3 tensor-parallel ranks" in msg and "1, 2 or 4" in msg
    msg = _message(check_query_groups, 2, 8, num_attention_heads=16, allow_replication=False)
    assert "cannot replicate them" in msg and "use --tensor-model-parallel-size 1 or 2" in msg
    assert "16 attention heads cannot form 3 query groups" in _message(check_query_groups, 3, 1, 16)
    assert "FFN hidden size 11008 cannot be split over 3 tensor-parallel ranks" in _message(
        check_ffn_hidden_size, 11008, 3)
    assert "60 experts cannot be split over 8 expert-parallel ranks; use --expert-model-parallel-size" in _message(
        check_experts, 60, 8)


def test_sequence_length_vs_context_parallel():
    msg = _message(check_seq_length, 4095, 2)
    assert "sequence length 4095 cannot be split into 2 x CP = 4 chunks (CP=2)" in msg
    assert "--seq-length 4092 or 4096" in msg and "--context-parallel-size 1" in msg
    assert check_seq_length(4096, 4) == 1024  # tokens each CP rank holds
    msg = _message(check_seq_length, 4096, 4, tp=3, sequence_parallel=True)  # 4096 % 8 == 0 but % 24 != 0
    assert "CP x TP = 12 sequence-parallel shards (TP=3)" in msg and "multiple of 24" in msg
    assert check_seq_length(4104, 1, tp=3, sequence_parallel=True) == 1368


def test_collect_gathers_every_failure():
    errors = collect(lambda: check_heads(32, 3), lambda: check_layers(28, 4), lambda: check_layers(28, 8))
    assert [e.code for e in errors] == ["heads", "layers"]


def test_sequence_parallel_remedy_names_tp_when_no_cp_fits():
    msg = _message(check_seq_length, 4096, 4, tp=3, sequence_parallel=True)
    assert "--tensor-model-parallel-size 1, 2, 4, 8, 16 or 32" in msg and "no --sequence-parallel" in msg
    assert "--context-parallel-size" not in msg  # no CP size fits TP=3 with sequence parallelism


def test_odd_sequence_under_cp_with_sequence_parallel_names_only_fixes_that_work():
    # issue 13 item 15: no TP size and no CP size fits an odd length, and dropping --sequence-parallel
    # still leaves CP's 2 x CP chunks: only the length is advice (was "--tensor-model-parallel-size none")
    msg = _message(check_seq_length, 4097, 2, tp=2, sequence_parallel=True)
    assert msg.endswith("it must be a multiple of 4; use --seq-length 4096 or 4100")
    assert "none" not in msg
    # even under CP but not a multiple of CP x TP: dropping sequence parallelism fixes it
    msg = _message(check_seq_length, 4092, 2, tp=8, sequence_parallel=True)
    assert "--tensor-model-parallel-size 1, 2, 3, 6, 11 or 22, or no --sequence-parallel" in msg
