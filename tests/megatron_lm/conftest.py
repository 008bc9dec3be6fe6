"""Fixtures for tests that run Megatron-LM's own ``pretrain_gpt.py`` (see mlm_harness.py).

How a test uses them::

    from mlm_harness import TINY_GPT

    @pytest.mark.slow
    def test_something(megatron_lm, tmp_path):
        run = megatron_lm.run([*TINY_GPT, "--transformer-impl", "local", "--train-iters", "4",
                               "--tensor-model-parallel-size", "2"], tmp_path / "tp2", nproc=2)
        assert run.losses[-1] < run.losses[0]          # full-precision lm loss per iteration
        assert run.record(2)["grad_norm"] == ...       # any iteration's record

``megatron_lm`` (session scope) unpacks the vendored Megatron-LM once and returns a
:class:`mlm_harness.MegatronLM`; ``MegatronLM.run(args, workdir, nproc=1, env=None,
timeout=300)`` launches ``torchrun --standalone -m ascend_patch pretrain_gpt.py ARGS`` on the cpu
target and returns a :class:`mlm_harness.MegatronRun` (``losses``, ``grad_norms``,
``record(i)``, ``printed``, ``output``), raising ``MegatronRunFailed`` with the output's tail
when the launch fails. Runs are slow (seconds each, several processes): mark tests
``@pytest.mark.slow`` and share one run between assertions (a module-scoped fixture).
Independent one-process launches use one core each: ``megatron_lm.start(...)`` them together and
collect them with ``mlm_harness.wait_all(...)``, so that on 2 cores they overlap instead of queueing.
A checkpoint made by ``ascend-patch convert`` is launched with ``mlm_harness.run_converted``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlm_harness import MegatronLM, find_tarball, unpack


@pytest.fixture(scope="session")
def megatron_lm(tmp_path_factory: pytest.TempPathFactory) -> MegatronLM:
    """The vendored Megatron-LM, unpacked once per session (or ``MEGATRON_LM_DIR`` as is)."""
    given = os.environ.get("MEGATRON_LM_DIR")
    if given:
        return MegatronLM(Path(given))
    return MegatronLM(unpack(find_tarball(), tmp_path_factory.mktemp("megatron-lm")))
