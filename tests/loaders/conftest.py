"""Fixtures for the converter tests: tiny HF checkpoints made once per session, and one megatron-core launch."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loaders_tiny import make_model, save_model  # noqa: E402
from mcore_numerics import cases_of, launch, prepare  # noqa: E402


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """family -> path of a saved tiny HF checkpoint (and the model that made it)."""
    made: dict[str, tuple[str, object]] = {}

    def get(family: str, **kwargs):
        key = family + repr(sorted(kwargs.items()))
        if key not in made:
            root = tmp_path_factory.mktemp(f"hf_{family}")
            model = make_model(family)
            made[key] = (save_model(model, str(root / "hf"), **kwargs), model)
        return made[key]

    return get


@pytest.fixture(scope="session")
def mcore_logits(request, tmp_path_factory, hf_checkpoint):
    """Case name -> megatron-core's logits checked against transformers (mcore_worker.py's result), for
    every :class:`mcore_numerics.Case` the session's collected tests are parametrised with (dense and
    MoE alike): one torchrun launch serves them all, so its processes import torch and megatron once."""
    cases = cases_of(request.session.items)
    root = tmp_path_factory.mktemp("mcore")
    return launch([prepare(case, hf_checkpoint, root) for case in cases], root)


@pytest.fixture
def options():
    from ascend_patch.loaders.formats import ConvertOptions

    def make(**kwargs):
        return ConvertOptions(**kwargs)

    return make
