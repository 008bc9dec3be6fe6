"""NCCL_* / TORCH_NCCL_* variables onto HCCL (npu) and gloo (cpu) counterparts, or reported."""

from __future__ import annotations

import os

import ascend_patch
from ascend_patch import usage
from ascend_patch.comm.env import env_patches, nccl_environment
from ascend_patch.config import Settings
from ascend_patch.usage import UsageRecorder


def _by_name(findings):
    return {f.name: f for f in findings}


def test_npu_counterparts_with_unit_conversion():
    env = {"NCCL_SOCKET_IFNAME": "eth0,ib", "NCCL_BUFFSIZE": str(4 * 1024 * 1024 + 1), "NCCL_IB_TIMEOUT": "18",
           "NCCL_IB_TC": "104", "NCCL_IB_SL": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "NCCL_SOCKET_FAMILY": "AF_INET6", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    found = _by_name(nccl_environment("npu", env))
    assert (found["NCCL_SOCKET_IFNAME"].counterpart, found["NCCL_SOCKET_IFNAME"].counterpart_value) == \
        ("HCCL_SOCKET_IFNAME", "eth0,ib")
    assert found["NCCL_BUFFSIZE"].counterpart_value == "5"  # bytes -> MB, rounded up
    assert found["NCCL_IB_TIMEOUT"].counterpart == "HCCL_RDMA_TIMEOUT"
    assert found["NCCL_IB_TC"].counterpart_value == "104"
    assert found["NCCL_IB_SL"].counterpart == "HCCL_RDMA_SL"
    assert found["TORCH_NCCL_ASYNC_ERROR_HANDLING"].counterpart == "HCCL_ASYNC_ERROR_HANDLING"
    assert found["TORCH_NCCL_BLOCKING_WAIT"].counterpart == "TORCH_HCCL_BLOCKING_WAIT"
    assert found["NCCL_SOCKET_FAMILY"].counterpart_value == "AF_INET6"
    assert all(f.effective for f in found.values())


def test_values_the_counterpart_cannot_take_and_variables_without_one_are_reported():
    env = {"NCCL_IB_TC": "130", "NCCL_IB_SL": "9", "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0",
           "HCCL_RDMA_TIMEOUT": "12", "NCCL_IB_TIMEOUT": "20"}
    found = _by_name(nccl_environment("npu", env))
    assert not found["NCCL_IB_TC"].effective and "multiple of 4" in found["NCCL_IB_TC"].detail
    assert not found["NCCL_IB_SL"].effective and "0..7" in found["NCCL_IB_SL"].detail
    assert found["NCCL_DEBUG"].counterpart is None
    assert "no HCCL counterpart" in found["NCCL_IB_HCA"].detail
    # a counterpart the user set wins
    assert found["NCCL_IB_TIMEOUT"].counterpart_value == "12" and "wins" in found["NCCL_IB_TIMEOUT"].detail


def test_torch_name_wins_over_its_deprecated_alias():
    env = {"NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    found = _by_name(nccl_environment("npu", env))
    assert found["TORCH_NCCL_ASYNC_ERROR_HANDLING"].counterpart_value == "3"
    assert "already comes from TORCH_NCCL_ASYNC_ERROR_HANDLING" in found["NCCL_ASYNC_ERROR_HANDLING"].detail


def test_npu_env_patches_set_the_counterpart(monkeypatch):
    monkeypatch.setenv("NCCL_BUFFSIZE", str(8 * 1024 * 1024))
    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    patch = next(p for p in env_patches("npu") if p.target == "HCCL_BUFFSIZE")
    assert patch.backends == frozenset({"npu"})
    assert patch.build(None) == "8"
    assert patch.build("64") == "64"  # set already: untouched


def test_cpu_target_carries_the_socket_name_to_gloo(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    rec = UsageRecorder()
    previous = usage.active_recorder()
    ascend_patch.apply(Settings(device="cpu"))
    try:
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
        # the reported list is computed at apply; check it on a recorder directly
        usage.set_recorder(rec)
        from ascend_patch.comm.env import note_unmapped

        note_unmapped("cpu")
        assert {u.api for u in rec.uses()} == {"environment NCCL_DEBUG"}
    finally:
        usage.set_recorder(previous)
        ascend_patch.remove()
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_gloo_rejects_ncclish_interface_syntax():
    found = _by_name(nccl_environment("cpu", {"NCCL_SOCKET_IFNAME": "^docker"}))
    assert not found["NCCL_SOCKET_IFNAME"].effective
    assert "plain interface names" in found["NCCL_SOCKET_IFNAME"].detail
