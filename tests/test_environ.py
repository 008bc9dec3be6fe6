"""The environment transaction: every variable it sets is put back exactly, newest first."""

from __future__ import annotations

import pytest

from ascend_patch.environ import EnvTransaction, carry_over_cuda_variables


@pytest.fixture
def env():
    return {"KEEP": "k", "OVERWRITE": "old"}


def test_restore_puts_back_values_and_unsets_what_was_unset(env):
    tx = EnvTransaction(env)
    tx.set("OVERWRITE", "new")
    tx.set("FRESH", "1")
    tx.set("OVERWRITE", "newer")  # the value before the first write is the one kept
    assert env == {"KEEP": "k", "OVERWRITE": "newer", "FRESH": "1"}
    assert tx.changes == (("OVERWRITE", "old"), ("FRESH", None))
    assert "FRESH" in tx and "KEEP" not in tx and len(tx) == 2
    tx.restore()
    assert env == {"KEEP": "k", "OVERWRITE": "old"} and tx.changes == ()


def test_restore_to_a_savepoint_keeps_earlier_writes(env):
    tx = EnvTransaction(env)
    tx.set("A", "1")
    mark = tx.savepoint()
    tx.set("B", "2")
    tx.set("A", "3")  # already recorded before the savepoint: stays
    tx.restore(mark)
    assert env == {"KEEP": "k", "OVERWRITE": "old", "A": "3"} and tx.changes == (("A", None),)
    tx.restore()
    assert env == {"KEEP": "k", "OVERWRITE": "old"}


def test_carry_over_sets_only_missing_counterparts(env):
    env.update(CUDA_VISIBLE_DEVICES="2,3", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               PYTORCH_NPU_ALLOC_CONF="mine")
    tx = EnvTransaction(env)
    carry_over_cuda_variables(tx)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "2,3" and env["PYTORCH_NPU_ALLOC_CONF"] == "mine"
    assert tx.changes == (("ASCEND_RT_VISIBLE_DEVICES", None),)
    tx.restore()
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env and env["PYTORCH_NPU_ALLOC_CONF"] == "mine"
