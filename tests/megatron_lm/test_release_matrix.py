"""Every supported Megatron release trains under ascend_patch: each vendored Megatron-LM snapshot's own
``pretrain_gpt.py``, unchanged, for eight launch kinds (and the torch_dist resume of the CI subset).

Releases (``mlm_harness.RELEASES``): 0.12.1, 0.13.1, 0.14.0, 0.15.3, 0.16.1 (the snapshot that pairs with the
installed megatron-core wheel), 0.17.1 (each carries its own ``megatron/core``, which shadows the wheel) and
main@d98e8a6 on Python 3.12, twice: ``main`` with triton hidden (as on an Ascend host) and ``main+triton``
with torch's triton importable.

Launch kinds, each a 2-process launch of the tiny GPT on mock data (``MegatronLM.tiny_gpt()``: the
vocabulary the release's mock data needs), Megatron's default dropout 0.1 unless said:

* ``te_tp2``: the default ``--transformer-impl transformer_engine`` (ascend_patch's TE-compatible layer) at
  TP2 with sequence parallelism, 4 iterations, saving torch_dist checkpoints at 2 and 4 (the uninterrupted run
  the resumes are compared with);
* ``resume_torch_dist``: ``--load`` its iteration-2 checkpoint, continue to 4: iterations 3 and 4 equal the
  uninterrupted run's bit for bit (losses, gradient norms, learning rate: the whole record);
* ``resume_torch``: the same launch in the torch format, stopped at 2 with ``--exit-interval`` as an
  interrupted job is, then resumed: iterations 1-2 and 3-4 equal the uninterrupted run's bit for bit;
* ``local_pp2``: ``--transformer-impl local``, two pipeline stages;
* ``vpp``: local, PP2 x 2 virtual stages (4 layers, 8 microbatches in flight);
* ``te_cp2``: the default impl, llama-style (RoPE, SwiGLU, RMSNorm, GQA, untied, no dropout), context
  parallelism 2 (p2p ring);
* ``moe_ep2_alltoall``: local impl, 4 experts top-2, expert parallelism 2, alltoall dispatcher (SequentialMLP);
* ``moe_ep2_grouped_gemm``: the default impl, the same MoE with ``--moe-grouped-gemm`` (TEGroupedMLP), in
  bf16 (Megatron-LM 0.12.1's own ``validate_args`` refuses grouped GEMM in fp32; bf16 for every release keeps
  one launch line);
* ``dp2_distopt``: the default impl, data parallelism 2 with the distributed optimizer and overlapped
  gradient reduce and parameter gather.

Each kind asserts that the launch ran what it says (Megatron's printed arguments), that every loss and
gradient norm is finite (the norms non-zero) and the last loss is below the first, and its own point
(the resumes' equality, no NaN under VPP). Launches are shared: the uninterrupted TE TP2 run serves three
kinds, and each launch runs once per session, however many tests read it (a failed launch fails each of
its tests with its error). At a release's first test, every launch its selected cells read runs, two side
by side (``mlm_harness.run_side_by_side``; a resume after the run it continues).

Which cells run: ``pytest`` (and CI) runs every release's ``te_tp2``, ``moe_ep2_grouped_gemm`` and
``resume_torch_dist``, and all kinds for 0.12.1 and 0.17.1 (``CI_RELEASES``); main with triton importable only under
``--release-matrix all``.
0.16.1, the release of the installed wheel, has every kind in CI already, compared more strictly than here
(against a one-process run, bit for bit): test_pretrain_gpt.py (PP2, VPP, DP2 distributed optimizer, both
resumes), test_te_transformer_impl.py (TE TP2, CP2 for each comm type) and test_moe_ep.py (EP2 alltoall, local
and TE grouped GEMM); its cells here run with the rest under ``--release-matrix all``; ``pytest --release-matrix all`` runs every cell (the others are skipped, saying so). main's cells
skip while the Python 3.12 environment is not built (``py312_env.py``; ``.ci/run`` builds it).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable

import pytest

from mlm_harness import MegatronLM, MegatronRun, MegatronRunFailed, run_side_by_side

pytestmark = pytest.mark.slow

RELEASES = ("0.12.1", "0.13.1", "0.14.0", "0.15.3", "0.16.1", "0.17.1", "main", "main+triton")
KINDS = ("te_tp2", "local_pp2", "vpp", "te_cp2", "moe_ep2_alltoall", "moe_ep2_grouped_gemm", "resume_torch",
         "dp2_distopt", "resume_torch_dist")
CI_KINDS = ("te_tp2", "moe_ep2_grouped_gemm", "resume_torch_dist")  # every release
CI_RELEASES = ("0.12.1", "0.17.1")  # every kind
COVERED = ("0.16.1",)  # every kind in CI already, by the wheel's own tests (above)
# main with triton importable (the registry's CUDA torch brings it) runs under --release-matrix all only: CI runs
# main as on an Ascend host, with triton hidden, the case the triton shim is for
CI_TRITON_KINDS: tuple[str, ...] = ()


def in_ci(release: str, kind: str) -> bool:
    if release == "main+triton":
        return kind in CI_TRITON_KINDS
    return release not in COVERED and (release in CI_RELEASES or kind in CI_KINDS)


ITERS = 3
TP2_SP = ("--tensor-model-parallel-size", "2", "--sequence-parallel")
LLAMA = ("--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--group-query-attention",
         "--num-query-groups", "2", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
         "--attention-dropout", "0.0", "--hidden-dropout", "0.0")
MOE = ("--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
       "--moe-aux-loss-coeff", "1e-2", "--disable-bias-linear", "--expert-model-parallel-size", "2")


# what each kind reads, and which launch must have succeeded before another starts
NEEDS = {"te_tp2": ("te_tp2",), "resume_torch_dist": ("te_tp2", "te_tp2_resumed_dist"),
         "resume_torch": ("te_tp2", "te_tp2_interrupted_torch", "te_tp2_resumed_torch")}
AFTER = {"te_tp2_resumed_dist": "te_tp2", "te_tp2_resumed_torch": "te_tp2_interrupted_torch"}


class Launches:
    """The launches one release's selected cells read: all run at the first use, two side by side (each
    resume after the run it continues), and kept (the run, or the failure it raised)."""

    def __init__(self, mlm: MegatronLM, root, kinds) -> None:
        self.mlm, self.root = mlm, root
        self.names = list(dict.fromkeys(name for kind in kinds for name in NEEDS.get(kind, (kind,))))
        self.done: dict[str, MegatronRun | MegatronRunFailed] = {}

    def base(self, iters: int = ITERS) -> list[str]:
        return [*self.mlm.tiny_gpt(), "--train-iters", str(iters)]

    def plan(self, name: str) -> list[str]:
        """The arguments of launch ``name`` (run in ``root/name``, where its checkpoint goes)."""
        work = self.root / name
        uninterrupted = [*self.base(4), *TP2_SP]  # what the resumes continue
        return {
            "te_tp2": [*uninterrupted, "--save", str(work / "ckpt"), "--save-interval", "2", "--ckpt-format",
                       "torch_dist"],
            "te_tp2_resumed_dist": [*uninterrupted, "--load", str(self.root / "te_tp2" / "ckpt"), "--ckpt-step", "2",
                                    "--ckpt-format", "torch_dist"],
            "te_tp2_interrupted_torch": [*uninterrupted, "--save", str(work / "ckpt"), "--save-interval", "100",
                                         "--exit-interval", "2", "--ckpt-format", "torch"],
            "te_tp2_resumed_torch": [*uninterrupted, "--load", str(self.root / "te_tp2_interrupted_torch" / "ckpt"),
                                     "--ckpt-format", "torch"],
            "local_pp2": [*self.base(), "--transformer-impl", "local", "--pipeline-model-parallel-size", "2"],
            "vpp": [*self.base(), "--transformer-impl", "local", "--pipeline-model-parallel-size", "2",
                    "--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "1"],
            "te_cp2": [*self.base(), *LLAMA, "--context-parallel-size", "2", "--cp-comm-type", "p2p"],
            "moe_ep2_alltoall": [*self.base(), *MOE, "--transformer-impl", "local", "--moe-token-dispatcher-type",
                                 "alltoall"],
            "moe_ep2_grouped_gemm": [*self.base(), *MOE, "--moe-token-dispatcher-type", "alltoall",
                                     "--moe-grouped-gemm", "--bf16"],
            "dp2_distopt": [*self.base(), "--use-distributed-optimizer", "--overlap-grad-reduce",
                            "--overlap-param-gather"],
        }[name]

    def __call__(self, name: str) -> MegatronRun:
        if not self.done:
            self.done = run_side_by_side(
                {n: functools.partial(self.mlm.start, self.plan(n), self.root / n, 2) for n in self.names}, AFTER)
        got = self.done[name]
        if isinstance(got, MegatronRunFailed):
            raise MegatronRunFailed(f"{self.mlm.name} launch {name}: {got}")
        return got


def _cause(failure: MegatronRunFailed) -> str:
    lines = str(failure).splitlines()
    return next((line for line in lines if line.startswith("first error:")), lines[0])[:300]


@pytest.fixture(scope="module")
def launches(request, megatron_release, tmp_path_factory) -> Callable[[str], Launches]:
    selected: dict[str, list[str]] = {}  # release -> the kinds this session runs
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if spec is None or item.get_closest_marker("skip"):
            continue
        if item.originalname == "test_release_trains":
            selected.setdefault(spec.params["release"], []).append(spec.params["kind"])
        elif item.originalname == "test_a_checkpoint_saved_by_one_release_continues_under_another":
            selected.setdefault(spec.params["saved_by"], []).append("te_tp2")
    per_release: dict[str, Launches] = {}
    yield_report = os.environ.get("MEGATRON_MATRIX_REPORT")  # a JSON file: each launch's outcome and wall time

    def report() -> None:
        done = {release: {name: ({"ok": True, "seconds": round(got.seconds, 1)} if isinstance(got, MegatronRun)
                                 else {"ok": False, "error": _cause(got)})
                          for name, got in launch.done.items()}
                for release, launch in per_release.items()}
        with open(yield_report, "w") as f:
            json.dump(done, f, indent=1)

    if yield_report:
        request.addfinalizer(report)

    def get(release: str) -> Launches:
        if release not in per_release:
            root = tmp_path_factory.mktemp("matrix-" + release.replace("+", "-"))
            per_release[release] = Launches(megatron_release(release), root, selected.get(release, KINDS))
        return per_release[release]

    return get


def printed_arg(run: MegatronRun, name: str) -> str:
    """The value Megatron-LM printed for argument ``name`` in its argument table."""
    found = re.search(rf"^\s*{re.escape(name)} \.+ (.*?)\s*$", run.output, re.MULTILINE)
    assert found, f"Megatron-LM printed no argument {name}"
    return found.group(1)


def assert_trains(run: MegatronRun, iterations: int = ITERS) -> None:
    assert run.iterations == list(range(1, iterations + 1)), run.iterations
    assert all(math.isfinite(x) for x in run.losses + run.grad_norms), (run.losses, run.grad_norms)
    assert all(norm > 0 for norm in run.grad_norms), run.grad_norms
    # each iteration sees other samples, so a step may rise a little (bf16 MoE: 8.3629, 8.3457, 8.3558)
    assert run.losses[-1] < run.losses[0], f"the loss does not fall: {run.losses}"


def check_te_tp2(launch: Launches) -> None:
    run = launch("te_tp2")
    assert_trains(run, 4)
    assert printed_arg(run, "transformer_impl") == "transformer_engine"
    assert printed_arg(run, "tensor_model_parallel_size") == "2" and printed_arg(run, "sequence_parallel") == "True"
    assert "successfully saved checkpoint" in run.output and (run.workdir / "ckpt" / "iter_0000002").is_dir()


def check_resume_torch_dist(launch: Launches) -> None:
    uninterrupted, resumed = launch("te_tp2"), launch("te_tp2_resumed_dist")
    assert resumed.iterations == [3, 4], resumed.iterations
    for i in (3, 4):
        assert resumed.record(i) == uninterrupted.record(i), f"iteration {i}"


def check_resume_torch(launch: Launches) -> None:
    uninterrupted, interrupted = launch("te_tp2"), launch("te_tp2_interrupted_torch")
    assert interrupted.iterations == [1, 2], interrupted.iterations
    assert interrupted.records == uninterrupted.records[:2]  # the format changes nothing before the save
    resumed = launch("te_tp2_resumed_torch")
    assert resumed.iterations == [3, 4], resumed.iterations
    for i in (3, 4):
        assert resumed.record(i) == uninterrupted.record(i), f"iteration {i}"


def check_local_pp2(launch: Launches) -> None:
    run = launch("local_pp2")
    assert_trains(run)
    assert printed_arg(run, "transformer_impl") == "local"
    assert printed_arg(run, "pipeline_model_parallel_size") == "2"


def check_vpp(launch: Launches) -> None:
    run = launch("vpp")
    assert "found NaN" not in run.output
    assert_trains(run)
    assert printed_arg(run, "virtual_pipeline_model_parallel_size") == "2"


def check_te_cp2(launch: Launches) -> None:
    run = launch("te_cp2")
    assert_trains(run)
    assert printed_arg(run, "transformer_impl") == "transformer_engine"
    assert printed_arg(run, "context_parallel_size") == "2" and printed_arg(run, "position_embedding_type") == "rope"


def _moe(run: MegatronRun) -> None:
    assert_trains(run)
    assert printed_arg(run, "expert_model_parallel_size") == "2" and printed_arg(run, "num_experts") == "4"
    assert printed_arg(run, "moe_token_dispatcher_type") == "alltoall"
    # (the aux loss is not asserted: releases before 0.16 send it to tensorboard only, not to the log line)


def check_moe_ep2_alltoall(launch: Launches) -> None:
    run = launch("moe_ep2_alltoall")
    _moe(run)
    assert printed_arg(run, "moe_grouped_gemm") == "False" and printed_arg(run, "transformer_impl") == "local"


def check_moe_ep2_grouped_gemm(launch: Launches) -> None:
    run = launch("moe_ep2_grouped_gemm")
    _moe(run)
    assert printed_arg(run, "moe_grouped_gemm") == "True" and printed_arg(run, "bf16") == "True"
    assert printed_arg(run, "transformer_impl") == "transformer_engine"
    assert "legacy GroupedMLP" not in run.output  # TEGroupedMLP, on the TE layer's GroupedLinear


def check_dp2_distopt(launch: Launches) -> None:
    run = launch("dp2_distopt")
    assert_trains(run)
    assert printed_arg(run, "data_parallel_size") == "2"
    assert printed_arg(run, "use_distributed_optimizer") == "True"
    assert printed_arg(run, "overlap_param_gather") == "True"


CHECKS: dict[str, Callable[[Launches], None]] = {kind: globals()[f"check_{kind}"] for kind in KINDS}
CELLS = [pytest.param(release, kind, id=f"{release}-{kind}",
                      marks=() if in_ci(release, kind) else pytest.mark.release_matrix_full)
         for release in RELEASES for kind in KINDS]


@pytest.mark.parametrize("release,kind", CELLS)
def test_release_trains(launches, release, kind):
    CHECKS[kind](launches(release))


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_launched_is_the_one_detected(megatron_release, release):
    """What ascend_patch's detection says the launches import: the snapshot's own megatron/core (a checkout
    shadowing the installed wheel), except 0.16.1's, which is the wheel; main says 0.20.0."""
    mlm = megatron_release(release)
    found = mlm.detected
    if (mlm.root / "megatron" / "core").is_dir():
        assert found["kind"] == "checkout" and found["path"] == str(mlm.root / "megatron" / "core"), found
        assert found["wheel"] == "0.16.1" and "shadows the installed wheel 0.16.1" in found["describe"], found
    else:
        assert found["kind"] == "wheel" and found["version"] == found["wheel"], found
    from ascend_patch.adaptors.megatron.releases import MAIN, supported

    assert found["version"] == (MAIN["version"] if release.startswith("main") else release), found
    assert supported(found["version"])
    triton = mlm.probe("import importlib.util; print(importlib.util.find_spec('triton') is not None)").strip()
    assert triton == str(release == "main+triton"), f"{release}: triton importable: {triton}"


@pytest.mark.parametrize("saved_by,resumed_by", [("0.12.1", "0.17.1")], ids=["0.12.1-to-0.17.1"])
def test_a_checkpoint_saved_by_one_release_continues_under_another(launches, megatron_release, tmp_path, saved_by,
                                                                     resumed_by):
    """MindSpeed-LLM's release (0.12.1) to Ascend's newest stack (0.17.1): the torch_dist checkpoint 0.12.1's
    uninterrupted TE TP2 run saved at iteration 2 is loaded by 0.17.1's pretrain_gpt.py with the same
    arguments (optimizer and RNG state included) and training goes on from iteration 3."""
    old = launches(saved_by)
    saved = old("te_tp2")
    resumed = megatron_release(resumed_by).run(old.plan("te_tp2_resumed_dist"), tmp_path / "resumed", nproc=2)
    assert re.search(r"successfully loaded checkpoint from .*te_tp2/ckpt .* at iteration 2", resumed.output)
    assert resumed.iterations == [3, 4], resumed.iterations
    assert all(math.isfinite(x) for x in resumed.losses + resumed.grad_norms)
    for i in (3, 4):  # the same model, data, optimizer and RNG state: the iterations 0.12.1 itself ran
        assert resumed.record(i)["losses"] == saved.record(i)["losses"], f"iteration {i}"
