"""``check --memory``'s pieces that need no Megatron run: the launch line, the schedule arithmetic, chips, the
non-tensor lines, the remedies, the report."""

from __future__ import annotations

import json

import pytest

from ascend_patch.check.memory.chips import CHIPS, chip, format_bytes, parse_size
from ascend_patch.check.memory.estimate import estimate_argv, microbatches_needed, roles
from ascend_patch.check.memory.launchline import flag, flag_int, parse_launch_line, with_flag, without
from ascend_patch.check.memory.overheads import MIB, overheads
from ascend_patch.check.memory.remedies import candidates
from ascend_patch.check.memory.report import memory_findings, memory_json
from ascend_patch.errors import FindingError


def test_launch_lines_as_clusters_write_them():
    line = parse_launch_line(["HCCL_BUFFSIZE=120", "torchrun", "--nnodes", "8", "--nproc-per-node=8", "--node-rank",
                              "0", "--master-addr", "10.0.0.1", "-m", "ascend_patch", "pretrain_gpt.py",
                              "--tensor-model-parallel-size", "4"])
    assert (line.world_size, line.script, line.argv, line.env) == (
        64, "pretrain_gpt.py", ["--tensor-model-parallel-size", "4"], {"HCCL_BUFFSIZE": "120"})
    line = parse_launch_line(["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              "train.py", "--bf16"])
    assert (line.world_size, line.script, line.argv) == (2, "train.py", ["--bf16"])
    assert parse_launch_line(["torchrun", "--nnodes", "1:4", "--nproc-per-node", "8", "x.py"]).world_size == 32
    assert parse_launch_line(["python3", "-m", "ascend_patch", "x.py", "--a"]).world_size == 1
    with pytest.raises(FindingError, match="--nproc-per-node gpu"):
        parse_launch_line(["torchrun", "--nproc-per-node", "gpu", "x.py"])
    with pytest.raises(FindingError, match="runs module other"):
        parse_launch_line(["torchrun", "-m", "other", "x.py"])


def test_flags_are_read_and_rewritten_in_both_spellings():
    argv = ["--micro-batch-size", "2", "--bf16", "--global_batch_size=64", "--data-path", "a"]
    assert (flag(argv, "micro-batch-size"), flag(argv, "bf16"), flag_int(argv, "global-batch-size")) == ("2", True, 64)
    assert flag(argv, "seq-length") is None
    assert without(argv, "micro-batch-size", 1) == ["--bf16", "--global_batch_size=64", "--data-path", "a"]
    assert with_flag(argv, "global-batch-size", "8")[-2:] == ["--global-batch-size", "8"]
    assert "--global_batch_size=64" not in with_flag(argv, "global-batch-size", "8")


def test_the_schedule_needs_only_as_many_micro_batches_as_its_peak():
    assert microbatches_needed(32, pp=1) == 1
    assert [microbatches_needed(m, pp=4) for m in (2, 4, 64)] == [2, 4, 4]  # 1F1B: pp in flight on stage 0
    # interleaved, PP2 x VPP2, groups of 2: warm-up of 4 virtual micro-batches, then one full cycle (2 x 2)
    assert microbatches_needed(8, pp=2, vpp=2) == 6 and microbatches_needed(4, pp=2, vpp=2) == 4
    assert microbatches_needed(64, pp=4, vpp=3) % 4 == 0


def test_estimate_argv_drops_files_and_sets_the_schedule():
    line = parse_launch_line(["torchrun", "--nproc-per-node", "8", "p.py", "--tensor-model-parallel-size", "2",
                              "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--global-batch-size",
                              "128", "--load", "/ckpt", "--save", "/ckpt", "--train-samples", "1000",
                              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/nowhere/qwen3"])
    with pytest.raises(FindingError, match="--vocab-size"):
        estimate_argv(line)
    argv, notes = estimate_argv(line, vocab_size=151936)
    assert flag(argv, "load") is None and flag(argv, "save") is None and flag(argv, "train-samples") is None
    assert (flag_int(argv, "train-iters"), flag_int(argv, "global-batch-size")) == (2, 4)  # 2 of 64 micro-batches
    assert (flag(argv, "tokenizer-type"), flag_int(argv, "vocab-size")) == ("NullTokenizer", 151935)
    assert any("2 of the 64 micro-batches" in n for n in notes)
    assert [(r.name, r.rank, len(r.ranks)) for r in roles(line, argv)] == [
        ("pipeline stage 0 (first)", 0, 4), ("pipeline stage 1 (last)", 4, 4)]


def test_chips_and_sizes():
    assert parse_size("64GB") == parse_size("64GiB") == parse_size("65536MB") == 64 << 30
    assert chip("Ascend910B3").hbm_bytes == 64 << 30 and chip("910b4").hbm_bytes == 32 << 30
    assert chip("A3").hbm_bytes == 64 << 30 and all(c.source for c in CHIPS.values())
    with pytest.raises(FindingError, match="known: 910B1"):
        chip("910X")
    with pytest.raises(FindingError):
        parse_size("lots")
    assert format_bytes(3 << 30) == "3.00 GiB"


def test_non_tensor_lines_name_their_sources_and_read_zero_on_cpu():
    npu = overheads("npu", 10 << 30, communicators=3, p2p_peers=1, env={"HCCL_BUFFSIZE": "120"})
    by_name = {o.name: o for o in npu}
    assert by_name["HCCL buffers"].bytes == 3 * 2 * 120 * MIB and "HCCL_BUFFSIZE" in by_name["HCCL buffers"].source
    assert by_name["HCCL point-to-point buffers"].bytes == 2 * 20 * MIB
    assert by_name["allocator margin"].bytes == (10 << 30) // 20
    assert by_name["runtime reservation"].bytes == 3419 * MIB
    off = overheads("npu", 0, communicators=3, p2p_peers=1, env={"P2P_HCCL_BUFFSIZE": "0"}, p2p_only_groups=1)
    assert off[0].bytes == 4 * 2 * 200 * MIB
    cpu = overheads("cpu", 10 << 30, communicators=3, p2p_peers=1, env={})
    assert [o.bytes for o in cpu] == [0, 0, 0] and all("cpu target" in o.source for o in cpu)


def test_remedies_keep_the_world_and_the_model_valid():
    line = parse_launch_line(["torchrun", "--nproc-per-node", "8", "p.py", "--tensor-model-parallel-size", "2",
                              "--pipeline-model-parallel-size", "2", "--num-layers", "12", "--num-attention-heads", "8",
                              "--group-query-attention", "--num-query-groups", "4", "--seq-length", "4096",
                              "--micro-batch-size", "2", "--recompute-granularity", "selective"])
    changes = [c.change for c in candidates(line)]
    assert changes == ["--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                       "--use-distributed-optimizer", "--tensor-model-parallel-size 4",
                       "--pipeline-model-parallel-size 4", "--context-parallel-size 2", "--micro-batch-size 1"]
    tp4 = next(c for c in candidates(line) if c.change.startswith("--tensor"))
    assert flag_int(list(tp4.argv), "tensor-model-parallel-size") == 4
    line.argv[line.argv.index("--num-query-groups") + 1] = "2"  # 2 query groups do not split over TP4
    assert not any(c.change.startswith("--tensor") for c in candidates(line))
    # one data-parallel rank: the distributed optimizer would shard nothing, so it is not offered
    alone = parse_launch_line(["torchrun", "--nproc-per-node", "2", "p.py", "--tensor-model-parallel-size", "2"])
    assert "--use-distributed-optimizer" not in [c.change for c in candidates(alone)]
    # unless the experts have data-parallel ranks of their own (EP1 over 2 ranks of TP2 x expert TP1)
    moe = parse_launch_line(["torchrun", "--nproc-per-node", "2", "p.py", "--tensor-model-parallel-size", "2",
                             "--num-experts", "4", "--expert-tensor-parallel-size", "1"])
    assert "--use-distributed-optimizer" in [c.change for c in candidates(moe)]
    # megatron-core's local layers, unfused attention: the TE layers' fused attention is offered (not with a --spec)
    local = parse_launch_line(["torchrun", "--nproc-per-node", "2", "p.py", "--transformer-impl", "local"])
    te = [c for c in candidates(local) if c.change == "--transformer-impl transformer_engine"]
    assert len(te) == 1 and flag(list(te[0].argv), "transformer-impl") == "transformer_engine"
    spec = parse_launch_line(["torchrun", "--nproc-per-node", "2", "p.py", "--transformer-impl", "local", "--spec",
                              "qwen3"])
    assert not any(c.change.startswith("--transformer-impl") for c in candidates(spec))


def test_json_document_and_findings_of_a_result():
    role = {"role": "pipeline stage 0 (first)", "ranks": [0, 1], "params_bytes": 10, "grads_bytes": 20,
            "optimizer_bytes": 30, "activations_bytes": 40, "buffers_bytes": 5, "total_bytes": 105}
    result = {"roles": [role], "device_bytes": 100, "fits": False,
              "remedies": [{"change": "--micro-batch-size 1", "total_bytes": 90, "fits": True, "error": None}]}
    doc = json.loads(memory_json(result))
    assert doc == {"ranks": [role], "device_bytes": 100, "fits": False}
    errors, warnings = memory_findings(result, "Ascend 910B3")
    assert [e.code for e in errors] == ["memory-oom"] and not warnings
    assert "5 B over" in errors[0].message and "--micro-batch-size 1 -> 90 B" in errors[0].remedy


def test_the_text_report_shows_the_table_the_sources_megatrons_formula_and_the_limits():
    from ascend_patch.check.memory.report import LIMITS, format_memory

    role = {"role": "every rank", "ranks": [0, 1], "params_bytes": 1 << 30, "grads_bytes": 2 << 30,
            "optimizer_bytes": 3 << 30, "activations_bytes": 4 << 30, "buffers_bytes": 0, "total_bytes": 10 << 30,
            "overheads": [{"name": "HCCL buffers", "bytes": 0, "source": "0 on the cpu target: gloo"}], "asked": [],
            "megatron_formula": {"weight_and_optimizer_bytes": 6 << 30, "activations_bytes": 1 << 30}}
    result = {"script": "pretrain_gpt.py", "world_size": 2, "megatron": "0.16.1", "target": "cpu", "seconds": 1.0,
              "roles": [role], "device_bytes": 16 << 30, "notes": ["a note"], "remedies": []}
    text = format_memory(result, "Ascend 910B4")
    assert "every rank  0-1" in text and "10.00 GiB" in text and "6.00 GiB" in text  # total, headroom
    assert "HCCL buffers" in text and "0 on the cpu target" in text and "- a note" in text
    assert ("weights and optimizer 6.00 GiB (estimated here: 6.00 GiB), activations 1.00 GiB (estimated here: "
            "4.00 GiB)") in text
    assert text.endswith(LIMITS) and "Nothing here was measured on an NPU." in LIMITS


def test_json_needs_the_device(capsys):
    from ascend_patch.cli import main

    code = main(["check", "--memory", "--format", "json", "--", "torchrun", "--nproc-per-node", "2", "pretrain_gpt.py"])
    assert code == 2 and "--format json needs the device's memory" in capsys.readouterr().out


def test_a_change_that_saves_nothing_is_said_to_save_0_and_not_offered_as_a_try():
    from ascend_patch.check.memory.report import format_memory

    gib = 1 << 30
    role = {"role": "every rank", "ranks": list(range(8)), "params_bytes": 15 * gib, "grads_bytes": 30 * gib,
            "optimizer_bytes": 11 * gib, "activations_bytes": 35 * gib, "buffers_bytes": 9 * gib,
            "total_bytes": 100 * gib, "overheads": [], "asked": [], "megatron_formula": {}}
    remedies = [{"change": "--recompute-granularity selective", "total_bytes": 100 * gib - (2 << 20), "fits": False,
                 "error": None},
                {"change": "--tensor-model-parallel-size 2", "total_bytes": 65 * gib, "fits": False, "error": None}]
    result = {"script": "pretrain_gpt.py", "world_size": 8, "megatron": "0.16.1", "target": "npu", "seconds": 1.0,
              "roles": [role], "device_bytes": 64 * gib, "fits": False, "notes": [], "remedies": remedies}
    errors, _ = memory_findings(result)
    remedy = errors[0].remedy
    assert "--tensor-model-parallel-size 2 -> 65.00 GiB" in remedy
    assert "--recompute-granularity selective -> " not in remedy
    assert "--recompute-granularity selective: re-estimated, saves 0 here" in remedy
    lines = {line.split("  ")[1]: line for line in format_memory(result).splitlines() if line.startswith("  --")}
    assert lines["--recompute-granularity selective"].endswith("saves 0 (2.00 MiB less: under 0.1% of the worst rank)")
    assert lines["--tensor-model-parallel-size 2"].endswith("65.00 GiB  saves 35.00 GiB")


def test_measured_exchanges_hand_gloo_copies_and_keep_async_and_coalesced_calls_as_they_are():
    """measure's blocking all_to_all_single runs on untracked copies (gloo's worker thread drops its references
    after the call returns: the caller's tensors must not die there); the result lands in the caller's output."""
    import torch
    import torch.distributed as dist

    from ascend_patch.check.memory.measure import exchanges_on_copies

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    original = dist.all_to_all_single
    seen = []

    def spy(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        seen.append((output.data_ptr(), input.data_ptr()))
        return original(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    try:
        dist.all_to_all_single = spy
        given, out = torch.arange(6.0).reshape(3, 2), torch.zeros(3, 2)
        with exchanges_on_copies():
            assert dist.all_to_all_single is not spy
            dist.all_to_all_single(out, given, [3], [3])
            assert torch.equal(out, given) and seen[-1][0] != out.data_ptr() and seen[-1][1] != given.data_ptr()
            out.zero_()
            dist.all_to_all_single(out, given, async_op=True).wait()  # the work holds the caller's own tensors
            assert torch.equal(out, given) and seen[-1] == (out.data_ptr(), given.data_ptr())
            with dist._coalescing_manager():  # a blocking call only queues its work there
                dist.all_to_all_single(out, given)
            assert seen[-1] == (out.data_ptr(), given.data_ptr())
        assert dist.all_to_all_single is spy
    finally:
        dist.all_to_all_single = original
        dist.destroy_process_group()


def _tracked_peak(step, fake: bool) -> int:
    """The peak of live tensor bytes MemTracker sees while ``step`` runs, on real or on fake tensors."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    from ascend_patch.check.memory.tracking import peak_tracker

    tracker = peak_tracker()
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(), tracker:
        step()
    return tracker.peak_total()


def test_the_estimates_shortcuts_allocate_on_fake_tensors_what_the_real_ops_allocate():
    """The estimate skips the writing of the grouped GEMM's weight gradients (bf16 products added into fp32
    main_grad: per-group fp32 casts) and runs Megatron's sort_chunks_by_idxs as its allocations alone; on fake
    tensors both must reach the peak the real ops reach on real tensors, forward and backward."""
    import torch
    from megatron.core.transformer.moe import moe_utils

    from ascend_patch.check.memory.shortcuts import sort_chunks_by_idxs
    from ascend_patch.ops.grouped_gemm import grouped_matmul

    def grouped():
        torch.manual_seed(0)
        x = torch.randn(48, 16, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4, 16, 24, dtype=torch.bfloat16, requires_grad=True)
        w.main_grad = torch.zeros(4, 16, 24)
        grouped_matmul(x, w, [5, 0, 31, 12], accumulate_wgrad=True).sum().backward()

    def sorted_chunks(sort):
        tokens = torch.randn(40, 8, requires_grad=True)
        probs = torch.rand(40, requires_grad=True)
        splits, order = torch.tensor([3, 9, 0, 12, 16]), torch.tensor([4, 1, 3, 0, 2])
        out, permuted = sort(tokens * 2, splits, order, probs=probs * 1)
        (out.sum() + permuted.sum()).backward()

    assert _tracked_peak(grouped, fake=True) == _tracked_peak(grouped, fake=False) > 0
    shortcut = sort_chunks_by_idxs(moe_utils.sort_chunks_by_idxs)
    real = _tracked_peak(lambda: sorted_chunks(moe_utils.sort_chunks_by_idxs), fake=False)
    assert _tracked_peak(lambda: sorted_chunks(shortcut), fake=True) == real > 0
    assert _tracked_peak(lambda: sorted_chunks(shortcut), fake=False) == real  # real tensors take the original


def test_the_null_tokenizer_stands_for_the_vocabulary_on_every_release(tmp_path):
    """Up to 0.17 Megatron's NullTokenizer adds its end-of-document id after --vocab-size ids; main's counts it."""
    from ascend_patch.check.memory.vocab import megatron_version_at, null_tokenizer_vocab_size

    assert null_tokenizer_vocab_size(151936, "0.12.1") == null_tokenizer_vocab_size(151936, "0.17.1") == 151935
    assert null_tokenizer_vocab_size(151936, "0.20.0rc0") == 151936  # Megatron-LM main as vendored
    core = tmp_path / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 20\nPATCH = 0\nPRE_RELEASE = 'rc0'\n")
    assert megatron_version_at(str(tmp_path)) == "0.20.0rc0"
    assert megatron_version_at(str(tmp_path / "megatron")) is None  # no megatron/core there: the installed one runs


def test_fake_shortcuts_replace_what_the_launch_imported_and_put_back_the_originals():
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    from ascend_patch.check.memory.megatron_names import FAKE_SHORTCUTS
    from ascend_patch.check.memory.shortcuts import _MAKERS, fake_shortcuts

    assert {name for _, name in FAKE_SHORTCUTS} == set(_MAKERS)
    original = dispatcher.sort_chunks_by_idxs
    with fake_shortcuts():
        assert dispatcher.sort_chunks_by_idxs is not original
    assert dispatcher.sort_chunks_by_idxs is original
