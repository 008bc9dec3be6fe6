"""The whole real patch table: every target changes while applied and is restored by identity after."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import ascend_patch
from ascend_patch.config import Settings
from ascend_patch.patch import PatchKind

_MISSING = object()


def _owner_and_name(target: str):
    module_name, attr = target.split(":", 1)
    owner = sys.modules.get(module_name) or importlib.import_module(module_name)
    parts = attr.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _own(owner, name):
    return vars(owner).get(name, _MISSING)


def test_remove_restores_every_original_by_identity():
    # the table on this machine, with every target module imported first (the table itself can
    # depend on what is imported: the megatron plugin patches functions torch.compile'd at import)
    for _ in range(2):
        with ascend_patch.patched(Settings(device="cpu")) as report:
            targets = [s.patch.target for s in report.rows("applied")
                       if s.patch.kind in (PatchKind.REPLACE, PatchKind.WRAP)]
            added = [s.patch.target for s in report.rows("applied") if s.patch.kind is PatchKind.ADD]
        for target in targets:
            _owner_and_name(target)
    assert len(targets) > 150
    before = {}
    for target in targets:
        owner, name = _owner_and_name(target)
        before[target] = (owner, name, _own(owner, name), getattr(owner, name, _MISSING))
    copies = {"torch.load": torch.load, "torch.distributed.init_process_group": torch.distributed.init_process_group,
              "torch.cuda.memory.memory_allocated": torch.cuda.memory.memory_allocated}

    report = ascend_patch.apply(Settings(device="cpu"))
    try:
        applied = {s.patch.target for s in report.rows("applied") if s.patch.kind in (PatchKind.REPLACE, PatchKind.WRAP)}
        assert applied == set(targets), set(targets) ^ applied
        for target in added:
            owner, name = _owner_and_name(target)
            assert hasattr(owner, name), target
        for target, (owner, name, own, _) in before.items():
            if isinstance(own, bool) and _own(owner, name) is own:
                continue  # a flag already set as the patch sets it (megatron's probe ran under an earlier patch)
            assert _own(owner, name) is not own, f"{target} was not changed"
        assert torch.load is not copies["torch.load"]  # by-value copies were re-bound
        assert torch.distributed.init_process_group is not copies["torch.distributed.init_process_group"]
        assert torch.cuda.memory.memory_allocated is not copies["torch.cuda.memory.memory_allocated"]
    finally:
        ascend_patch.remove()

    for target, (owner, name, own, value) in before.items():
        assert _own(owner, name) is own, f"{target} not restored"
        assert getattr(owner, name, _MISSING) is value, f"{target} not restored"
    for target in added:  # added names are gone again
        owner, name = _owner_and_name(target)
        assert _own(owner, name) is _MISSING, target
    assert torch.load is copies["torch.load"]
    assert torch.distributed.init_process_group is copies["torch.distributed.init_process_group"]
    assert torch.cuda.memory.memory_allocated is copies["torch.cuda.memory.memory_allocated"]


def test_deferred_target_imported_after_apply(tmp_path, monkeypatch):
    """A module imported after ascend_patch that copies a patched name by value sees the patch."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ap_late_user.py").write_text("from torch.cuda import current_device, is_available\n")
    with ascend_patch.patched(Settings(device="cpu")):
        import ap_late_user

        assert ap_late_user.is_available() is True
        assert ap_late_user.current_device() == 0
    assert ap_late_user.is_available is torch.cuda.is_available  # restored with the rest
    assert ap_late_user.is_available() is False
    del sys.modules["ap_late_user"]


def test_import_before_apply_is_rebound(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ap_early_user.py").write_text("from torch.cuda import is_available\n")
    import ap_early_user

    original = ap_early_user.is_available
    with ascend_patch.patched(Settings(device="cpu")) as report:
        assert ap_early_user.is_available() is True
        status = next(s for s in report.statuses if s.patch.target == "torch.cuda:is_available")
        assert "ap_early_user.is_available" in status.rebound
    assert ap_early_user.is_available is original
    del sys.modules["ap_early_user"]


def test_transformers_from_pretrained_under_the_patch(tmp_path):
    """transformers builds on the meta device; rotary inv_freq must come out initialised."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(tmp_path)
    with ascend_patch.patched(Settings(device="cpu")):
        model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path).to("cuda")
        inv_freq = model.model.rotary_emb.inv_freq
        expected = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
        assert torch.allclose(inv_freq, expected)
        ids = torch.tensor([[1, 2, 3]], device="cuda")
        assert torch.isfinite(model(ids).logits).all()
