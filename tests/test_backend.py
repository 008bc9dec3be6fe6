"""Backend selection: cpu and npu targets, auto, and the real-CUDA machine."""

import importlib.machinery
import os
import sys
import types

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


# -- auto with torch_npu present (a stand-in module), and on a machine with CUDA ---------

_NPU_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
             "PYTORCH_NPU_ALLOC_CONF", "CUDA_LAUNCH_BLOCKING", "ASCEND_LAUNCH_BLOCKING")


class _CountingNpu:
    """TEST DOUBLE for torch.npu: sees ``count`` devices, remembers the environment it counted them in."""

    def __init__(self, count):
        self.count = count
        self.visible_when_counted = []

    def device_count(self):
        self.visible_when_counted.append(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"))
        return self.count


def _npu_rms_norm(x, gamma, epsilon=1e-6):
    return x * gamma


@pytest.fixture
def npu_env():
    """The CUDA / NPU runtime variables, put back exactly as they were after the test."""
    saved = {name: os.environ.get(name) for name in _NPU_VARS}
    for name in _NPU_VARS:
        os.environ.pop(name, None)
    try:
        yield os.environ
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def fake_torch_npu(monkeypatch, npu_env):
    """Insert a torch_npu stand-in into sys.modules whose torch.npu sees ``count`` devices (both restored)."""
    import torch

    def install(count=2):
        module = types.ModuleType("torch_npu")
        module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)
        module.npu_rms_norm = _npu_rms_norm
        npu = _CountingNpu(count)
        monkeypatch.setitem(sys.modules, "torch_npu", module)
        monkeypatch.setattr(torch, "npu", npu, raising=False)
        return npu

    return install


def test_probe_and_npu_backend_with_torch_npu_seeing_devices(fake_torch_npu):
    import torch

    npu = fake_torch_npu(2)
    assert backend_mod.probe_npu() == (True, "torch_npu sees 2 NPU device(s)")
    b = backend_mod.npu_backend("asked")
    assert (b.name, b.device_type, b.dist_backend, b.keeps_index, b.reason) == ("npu", "npu", "hccl", True, "asked")
    assert b.device_module is npu is torch.npu
    assert b.kernels.get("npu_rms_norm") is _npu_rms_norm and b.kernels.get("npu_swiglu") is None


def test_auto_picks_npu_when_torch_npu_sees_a_device(fake_torch_npu):
    fake_torch_npu(4)
    sel = select_backend(Settings(device="auto"))
    assert sel.backend.name == "npu" and sel.backend.dist_backend == "hccl"
    assert sel.reason == "auto: torch_npu sees 4 NPU device(s)" == sel.backend.reason


def test_auto_with_torch_npu_but_no_device_picks_cpu(fake_torch_npu):
    fake_torch_npu(0)
    sel = select_backend(Settings(device="auto"))
    assert sel.backend.name == "cpu"
    assert sel.reason == "auto: torch_npu imported but sees no NPU device; using the cpu target"


def test_npu_beats_a_cuda_device(fake_torch_npu, monkeypatch):
    fake_torch_npu(1)
    monkeypatch.setattr(backend_mod, "_real_cuda_devices", lambda: 2)
    assert select_backend(Settings(device="auto")).backend.name == "npu"


def test_visible_devices_are_carried_over_before_the_probe(fake_torch_npu, npu_env):
    npu = fake_torch_npu(2)
    npu_env["CUDA_VISIBLE_DEVICES"] = "2,3"
    npu_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    sel = select_backend(Settings(device="auto"))
    assert npu.visible_when_counted == ["2,3"]  # set before torch.npu.device_count() ran
    assert npu_env["ASCEND_RT_VISIBLE_DEVICES"] == "2,3"
    assert npu_env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert sel.environ == (("ASCEND_RT_VISIBLE_DEVICES", None), ("PYTORCH_NPU_ALLOC_CONF", None))
    sel.env.restore()
    assert "ASCEND_RT_VISIBLE_DEVICES" not in npu_env and "PYTORCH_NPU_ALLOC_CONF" not in npu_env


def test_a_counterpart_the_user_set_wins(fake_torch_npu, npu_env):
    npu = fake_torch_npu(2)
    npu_env["CUDA_VISIBLE_DEVICES"] = "2,3"
    npu_env["ASCEND_RT_VISIBLE_DEVICES"] = "5"
    sel = select_backend(Settings(device="npu"))
    assert npu.visible_when_counted == [] and sel.environ == ()
    assert npu_env["ASCEND_RT_VISIBLE_DEVICES"] == "5"


def test_environment_left_as_it_was_when_the_target_is_not_npu(fake_torch_npu, npu_env):
    npu = fake_torch_npu(0)
    npu_env["CUDA_VISIBLE_DEVICES"] = "1"
    sel = select_backend(Settings(device="auto"))
    assert sel.backend.name == "cpu" and sel.environ == ()
    assert npu.visible_when_counted == ["1"]  # the probe still ran with the mapping
    assert "ASCEND_RT_VISIBLE_DEVICES" not in npu_env


def test_environment_left_as_it_was_when_npu_is_unavailable(npu_env):
    npu_env["CUDA_VISIBLE_DEVICES"] = "1"
    with pytest.raises(BackendUnavailable):
        select_backend(Settings(device="npu"))
    assert "ASCEND_RT_VISIBLE_DEVICES" not in npu_env and npu_env["CUDA_VISIBLE_DEVICES"] == "1"


def test_auto_on_a_machine_with_real_cuda_warns_and_patches_nothing(monkeypatch, npu_env):
    import torch

    import ascend_patch

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    npu_env["CUDA_VISIBLE_DEVICES"] = "0,1"
    is_available, to = torch.cuda.is_available, torch.Tensor.to
    with pytest.warns(UserWarning, match=r"ascend_patch: auto: torch_npu is not installed, and this machine has "
                                         r"2 real CUDA device\(s\); ascend_patch leaves the process unpatched"):
        report = ascend_patch.apply(Settings(device="auto"))
    try:
        assert report.target is None and not report.active and report.statuses == []
        assert ascend_patch.active_backend() is None
        assert torch.cuda.is_available is is_available and torch.Tensor.to is to
        assert "ASCEND_RT_VISIBLE_DEVICES" not in npu_env
    finally:
        ascend_patch.remove()
