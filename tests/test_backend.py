"""Backend selection: cpu and npu targets, auto, and the real-CUDA machine."""

import pytest

from ascend_patch import backend as backend_mod
from ascend_patch.backend import BackendUnavailable, KernelTable, select_backend
from ascend_patch.config import Settings


def test_cpu_target():
    sel = select_backend(Settings(device="cpu"))
    b = sel.backend
    assert (b.name, b.device_type, b.dist_backend, b.keeps_index) == ("cpu", "cpu", "gloo", False)
    assert b.kernels.names() == []
    assert str(b.device(3)) == "cpu"


def test_disabled():
    sel = select_backend(Settings(enabled=False))
    assert sel.backend is None and "ASCEND_PATCH=0" in sel.reason


def test_npu_requested_without_torch_npu_is_a_clear_error():
    with pytest.raises(BackendUnavailable, match="torch_npu is not installed.*ASCEND_PATCH_DEVICE=cpu"):
        select_backend(Settings(device="npu"))


def test_auto_without_npu_picks_cpu():
    sel = select_backend(Settings(device="auto"))
    assert sel.backend.name == "cpu"
    assert "torch_npu is not installed" in sel.reason


def test_auto_on_a_cuda_machine_applies_nothing(monkeypatch):
    monkeypatch.setattr(backend_mod, "_real_cuda_devices", lambda: 2)
    sel = select_backend(Settings(device="auto"))
    assert sel.backend is None
    assert "2 real CUDA device(s)" in sel.reason and "unpatched" in sel.reason


def test_kernel_table_override_restores():
    def k(x):
        return x

    table = KernelTable({"a": k})
    with table.override(b=k, a=None):
        assert table.get("a") is None and table.get("b") is k
    assert table.get("a") is k and table.get("b") is None
