"""Fixtures for tests that run Megatron-LM's own ``pretrain_gpt.py`` (see mlm_harness.py).

How a test uses them::

    from mlm_harness import TINY_GPT

    @pytest.mark.slow
    def test_something(megatron_lm, tmp_path):
        run = megatron_lm.run([*TINY_GPT, "--transformer-impl", "local", "--train-iters", "4",
                               "--tensor-model-parallel-size", "2"], tmp_path / "tp2", nproc=2)
        assert run.losses[-1] < run.losses[0]          # full-precision lm loss per iteration
        assert run.record(2)["grad_norm"] == ...       # any iteration's record

``megatron_lm`` (session scope) unpacks the vendored Megatron-LM 0.16.1 once and returns a
:class:`mlm_harness.MegatronLM`; ``megatron_release(name)`` does the same for any release of
``mlm_harness.RELEASES`` ("0.12.1" ... "0.17.1", "main"; "main+triton" is main with triton importable, "main"
hides it as on an Ascend host) and for main uses the Python 3.12 environment ``py312_env.py`` builds (main's
tests skip, saying how to build it, while there is none);
``megatron_lm`` is ``megatron_release("0.16.1")``. ``MegatronLM.tiny_gpt()`` is ``TINY_GPT`` with the
vocabulary that release's mock data needs; ``MegatronLM.run(args, workdir, nproc=1, env=None,
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
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mlm_harness import RELEASES, MegatronLM, find_tarball, python_tools, unpack


@pytest.fixture(scope="session")
def megatron_release(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], MegatronLM]:
    """``get(name)``: the vendored Megatron-LM ``name`` unpacked once per session, with the interpreter it needs.

    Names: the keys of ``mlm_harness.RELEASES``, and ``"main+triton"`` (main with triton importable; plain
    ``"main"`` launches with triton hidden, as on an Ascend host). 0.16.1 is ``MEGATRON_LM_DIR`` as is when set.
    main skips the calling test when the Python 3.12 environment is not built (``py312_env.ready``).
    """
    trees: dict[str, Path] = {}
    made: dict[str, MegatronLM] = {}

    def interpreter(release: str) -> str:
        needed = RELEASES[release].python
        if sys.version_info[:2] >= needed:
            return sys.executable
        import py312_env

        assert needed == py312_env.NEEDED, f"no environment builder for Python {needed}"
        python = py312_env.ready()
        if python is None:
            pytest.skip(py312_env.HOW_TO_BUILD)
        return str(python)

    def get(name: str) -> MegatronLM:
        if name in made:
            return made[name]
        release, _, variant = name.partition("+")
        if release not in RELEASES or variant not in ("", "triton") or variant and release != "main":
            raise KeyError(f"unknown Megatron-LM release {name!r}; known: {', '.join(RELEASES)}, main+triton")
        if release not in trees:
            given = os.environ.get("MEGATRON_LM_DIR") if release == "0.16.1" else None
            trees[release] = Path(given) if given else unpack(find_tarball(release),
                                                              tmp_path_factory.mktemp(f"megatron-lm-{release}"))
        python = interpreter(release)
        tools = python_tools(python, tmp_path_factory.mktemp(f"python-tools-{release}"))
        made[name] = MegatronLM(trees[release], python=python, tools=tools, name=name,
                                hide_triton=release == "main" and not variant)
        made[name].build_helpers()  # before any launch: two side by side would both build them
        return made[name]

    return get


@pytest.fixture(scope="session")
def megatron_lm(megatron_release: Callable[[str], MegatronLM]) -> MegatronLM:
    """The vendored Megatron-LM 0.16.1, unpacked once per session (or ``MEGATRON_LM_DIR`` as is)."""
    return megatron_release("0.16.1")
