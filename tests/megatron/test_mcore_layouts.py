"""Stock megatron-core trains the same model to the same losses in every parallel layout (cpu target).

Every layout starts from one checkpoint: a TP1/PP1 iteration-0 checkpoint written by the
example itself, re-sharded for the layout by the reference re-sharder in reshard.py and
loaded with ``--load --finetune``. fp32, no dropout, 5 steps of 8 samples; each layout's
per-step losses must equal TP1's within 1e-5 relative, and the loss must fall.
"""

from __future__ import annotations

import pytest

from mcore_run import run_example, start_example, wait_examples
from reshard import reshard_checkpoint

pytestmark = pytest.mark.slow

COMMON = ("--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
          "--hidden-dropout", "0", "--attention-dropout", "0", "--no-rope-fusion", "--lr", "1e-3")
# a Qwen3-shaped model: RoPE, RMSNorm, SwiGLU, GQA, q/k norm, untied embeddings, the qwen3 spec
QWEN3 = ("--spec", "qwen3", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32", "--disable-bias-linear",
         "--qk-layernorm", "--untie-embeddings-and-output-weights")
REL = 1e-5


def _assert_same_losses(layout, got, reference):
    assert [r["iteration"] for r in got] == [1, 2, 3, 4, 5], f"{layout}: iterations {got}"
    for mine, ref in zip(got, reference):
        rel = abs(mine["loss"] - ref["loss"]) / abs(ref["loss"])
        assert rel <= REL, (f"{layout}: iteration {mine['iteration']} loss {mine['loss']!r} vs TP1 "
                            f"{ref['loss']!r} (relative {rel:.2e} > {REL})")


class _Model:
    """One model family: its initial checkpoint, re-sharded per layout, and TP1's losses."""

    def __init__(self, root, extra):
        self.root, self.extra = root, tuple(extra)
        self.reference: list[dict] = []

    def start_init(self):
        return start_example(str(self.root), 1, *COMMON, *self.extra, "--train-iters", "0",
                             "--save", str(self.root / "init"))

    def set_reference(self, records):
        assert len(records) == 5
        losses = [r["loss"] for r in records]
        assert losses[-1] < losses[0] - 0.3, f"the loss does not fall: {losses}"
        self.reference = records

    def checkpoint(self, tp, pp):
        path = self.root / f"init_tp{tp}_pp{pp}"
        if not path.exists():
            reshard_checkpoint(str(self.root / "init"), str(path), tp, pp)
        return str(path)

    def start_train(self, nproc, tp, pp, *flags):
        return start_example(str(self.root), nproc, *COMMON, *self.extra, "--load", self.checkpoint(tp, pp),
                             "--finetune", "--tensor-model-parallel-size", str(tp),
                             "--pipeline-model-parallel-size", str(pp), *flags)

    def train(self, nproc, tp, pp, *flags):
        return self.start_train(nproc, tp, pp, *flags).wait()


FAMILIES = {"gpt_tied": (), "gpt_untied": ("--untie-embeddings-and-output-weights",), "qwen3": QWEN3}


@pytest.fixture(scope="module")
def families(request, tmp_path_factory):
    """The families the collected tests use, each with its initial checkpoint and TP1 reference run. These
    are one-process launches (one core each), independent across families: all the families' initial
    checkpoints are written side by side, then all their reference runs are made side by side."""
    used = [name for name in FAMILIES if any(name in getattr(item, "fixturenames", ())
                                             for item in request.session.items)]
    made = {name: _Model(tmp_path_factory.mktemp(name), FAMILIES[name]) for name in used}
    wait_examples(*(model.start_init() for model in made.values()))
    references = wait_examples(*(model.start_train(1, 1, 1) for model in made.values()))
    for model, records in zip(made.values(), references):
        model.set_reference(records)
    return made


@pytest.fixture(scope="module")
def gpt_tied(families):
    return families["gpt_tied"]


@pytest.fixture(scope="module")
def gpt_untied(families):
    return families["gpt_untied"]


@pytest.fixture(scope="module")
def qwen3(families):
    return families["qwen3"]


@pytest.mark.parametrize("layout, nproc, tp, pp, flags", [
    ("TP2", 2, 2, 1, ()),
    ("TP2+SP", 2, 2, 1, ("--sequence-parallel",)),
    ("PP2 tied", 2, 1, 2, ()),
    ("DP2 distributed optimizer", 2, 1, 1, ("--use-distributed-optimizer",)),
    ("CP2 (gpt spec)", 2, 1, 1, ("--context-parallel-size", "2", "--spec", "gpt")),
    ("TP2xPP2", 4, 2, 2, ()),
])
def test_gpt_layouts_match_tp1(gpt_tied, layout, nproc, tp, pp, flags):
    _assert_same_losses(layout, gpt_tied.train(nproc, tp, pp, *flags), gpt_tied.reference)


def test_pp2_untied_matches_tp1(gpt_untied):
    _assert_same_losses("PP2 untied", gpt_untied.train(2, 1, 2), gpt_untied.reference)


@pytest.mark.parametrize("layout, nproc, tp, pp, flags", [
    ("qwen3 TP2+SP", 2, 2, 1, ("--sequence-parallel",)),
    ("qwen3 CP2", 2, 1, 1, ("--context-parallel-size", "2")),
])
def test_qwen3_layouts_match_tp1(qwen3, layout, nproc, tp, pp, flags):
    _assert_same_losses(layout, qwen3.train(nproc, tp, pp, *flags), qwen3.reference)


def _assert_megatron_layout(path):
    """What Megatron-LM's loader (and the converter) read from model_optim_rng.pt."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    assert state["checkpoint_version"] == 3.0 and state["iteration"] == 3
    args = state["args"]
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.padded_vocab_size) == (4, 64, 4, 256)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (1, 1)
    assert args.consumed_train_samples == 24 and args.iteration == 3
    assert {"optimizer", "opt_param_scheduler", "rng_state", "model"} <= set(state)
    assert state["model"]["embedding.word_embeddings.weight"].shape == (256, 64)
    assert "decoder.layers.3.mlp.linear_fc2.weight" in state["model"]


@pytest.mark.parametrize("nproc, flags", [(1, ()), (2, ("--use-distributed-optimizer",))],
                         ids=["TP1 Adam", "DP2 distributed optimizer"])
def test_save_load_resumes_with_identical_losses(tmp_path, nproc, flags):
    """3 steps, --save; a new run --load's it and steps 4 and 5 equal an uninterrupted run's."""
    def straight_run():
        return start_example(str(tmp_path), nproc, *COMMON, *flags)

    def first_run():
        return start_example(str(tmp_path), nproc, *COMMON, *flags, "--train-iters", "3", "--save", str(tmp_path / "ck"))

    if nproc == 1:  # independent runs of one core each: side by side
        straight, first = wait_examples(straight_run(), first_run())
    else:
        straight, first = straight_run().wait(), first_run().wait()
    assert [r["loss"] for r in first] == [r["loss"] for r in straight[:3]]
    assert (tmp_path / "ck" / "latest_checkpointed_iteration.txt").read_text() == "3"
    files = sorted(p.name for p in (tmp_path / "ck" / "iter_0000003" / "mp_rank_00").iterdir())
    assert files == (["distrib_optim.pt", "model_optim_rng.pt"] if flags else ["model_optim_rng.pt"])
    _assert_megatron_layout(tmp_path / "ck" / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt")
    resumed = run_example(str(tmp_path), nproc, *COMMON, *flags, "--load", str(tmp_path / "ck"))
    assert [r["iteration"] for r in resumed] == [4, 5]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight[3:]]
