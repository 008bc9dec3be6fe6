"""nccl -> gloo wherever a process group is made, and how nccl-name checks behave (one process, world 1)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import ascend_patch
from ascend_patch.backend import Backend, UnsupportedOnTarget
from ascend_patch.comm import backend_names
from ascend_patch.comm.backend_names import real_backend, translate_backend
from ascend_patch.comm.nccl_options import ProcessGroupNCCL, translate_pg_options
from ascend_patch import usage
from ascend_patch.usage import UsageRecorder


def _init(**kwargs):
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30), **kwargs)


@pytest.fixture
def world1(patched):
    """The cpu target applied and a one-rank 'nccl' default group (really gloo)."""
    _init()
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def recorder(patched):
    """Records the CUDA API uses the comm patches note, for the duration of one test."""
    rec = UsageRecorder()
    previous = usage.active_recorder()
    usage.set_recorder(rec)
    try:
        yield rec
    finally:
        usage.set_recorder(previous)
        if dist.is_initialized():
            dist.destroy_process_group()


def _uses(rec: UsageRecorder) -> set[str]:
    return {u.api for u in rec.uses()}


def test_translate_backend_forms():
    cpu = Backend("cpu", "cpu", "gloo", None)
    npu = Backend("npu", "npu", "hccl", None, keeps_index=True)
    assert translate_backend("nccl", cpu) == "gloo"
    assert translate_backend(dist.Backend.NCCL, npu) == "hccl"
    assert translate_backend("cpu:gloo,cuda:nccl", cpu) == "cpu:gloo"
    assert translate_backend("cpu:gloo,cuda:nccl", npu) == "cpu:gloo,npu:hccl"
    assert translate_backend("gloo", cpu) == "gloo"
    assert translate_backend(None, cpu) is None


def test_program_code_sees_nccl_and_torch_sees_gloo(world1):
    assert dist.get_backend() == "nccl"
    assert dist.get_backend() == dist.Backend.NCCL
    assert real_backend() == "gloo"
    inherited = dist.new_group([0])  # backend=None inherits the default group's backend, and its name
    assert dist.get_backend(inherited) == "nccl"
    explicit = dist.new_group([0], backend="gloo")
    assert dist.get_backend(explicit) == "gloo"
    # torch's own code decides from the real backend: monitored_barrier insists on gloo
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    gathered = [None]
    dist.all_gather_object(gathered, {"rank": 0})  # c10d internals that ask is_nccl_available()
    assert gathered == [{"rank": 0}]
    assert dist.is_nccl_available() is True
    assert dist.is_backend_available("nccl") is True
    assert backend_names.requested_backend() == "nccl"


def test_removing_the_patch_restores_the_real_names(patched):
    _init()
    try:
        assert dist.get_backend() == "nccl"
        original = c10d.get_backend.__wrapped__
        ascend_patch.remove()
        assert c10d.get_backend is original and dist.get_backend is original
        assert dist.get_backend() == "gloo"
        assert dist.is_nccl_available() is False  # torch's cpu build
        assert not hasattr(dist, "ProcessGroupNCCL")
    finally:
        dist.destroy_process_group()


def test_subgroups_barrier_and_device_id(recorder):
    _init(device_id=torch.device("cuda", 0))  # names a CUDA device: dropped on the host
    cur, groups = dist.new_subgroups(group_size=1, backend="nccl")
    assert dist.get_backend(cur) == "nccl" and real_backend(cur) == "gloo"
    assert len(groups) == 1
    cur2, _ = dist.new_subgroups_by_enumeration([[0]], backend="nccl")
    assert dist.get_backend(cur2) == "nccl"
    dist.barrier(device_ids=[0])
    x = torch.ones(3)
    dist.all_reduce(x, group=cur)
    assert x.tolist() == [1.0, 1.0, 1.0]
    uses = _uses(recorder)
    assert "torch.distributed.barrier(device_ids=...)" in uses
    assert "torch.distributed.new_subgroups(backend='nccl')" in uses
    assert "torch.distributed.init_process_group(backend='nccl')" in uses


def test_nccl_options_are_dropped_on_the_host_with_a_report(recorder):
    _init()
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)  # as megatron's get_nccl_options
    options.config.max_ctas = 8
    options.config.cga_cluster_size = 2
    group = dist.new_group([0], pg_options=options)
    x = torch.full((2,), 3.0)
    dist.all_reduce(x, group=group)
    assert x.tolist() == [3.0, 3.0]
    assert any("ProcessGroupNCCL.Options (dropped" in u for u in _uses(recorder))
    with pytest.raises(AttributeError, match="no field 'max_cta'"):
        options.config.max_cta = 1
    with pytest.raises(UnsupportedOnTarget, match="init_process_group/new_group"):
        dist.ProcessGroupNCCL(None, 0, 1)


class HcclOptionsStandIn:
    """A stand-in with the documented fields of torch_npu's ProcessGroupHCCL.Options (tests only)."""

    def __init__(self):
        self.hccl_config = {}
        self.is_high_priority_stream = False
        self._timeout = None


def test_nccl_options_become_hccl_options_on_npu():
    npu = Backend("npu", "npu", "hccl", None, keeps_index=True)
    cpu = Backend("cpu", "cpu", "gloo", None)
    options = ProcessGroupNCCL.Options(is_high_priority_stream=True)
    options._timeout = datetime.timedelta(minutes=5)
    options.config.max_ctas = 4
    hccl = translate_pg_options(options, npu, hccl_options=HcclOptionsStandIn)
    assert isinstance(hccl, HcclOptionsStandIn)
    assert hccl.is_high_priority_stream is True
    assert hccl._timeout == datetime.timedelta(minutes=5)
    assert hccl.hccl_config == {}  # NCCL's config fields have no HCCL counterpart
    assert translate_pg_options(options, cpu) is None
    other = object()
    assert translate_pg_options(other, npu, hccl_options=HcclOptionsStandIn) is other


def test_device_mesh_for_cuda_is_a_mesh_of_the_target(world1):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
    assert mesh.device_type == "cpu"
    assert dist.get_backend(mesh.get_group("dp")) == "nccl"
    x = torch.full((4,), 2.0)
    dist.all_reduce(x, group=mesh.get_group("dp"))
    assert x.tolist() == [2.0] * 4
    overridden = init_device_mesh("cuda", (1,), mesh_dim_names=("tp",), backend_override={"tp": "nccl"})
    assert real_backend(overridden.get_group("tp")) == "gloo"
    from_group = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    assert from_group.device_type == "cpu"


def test_ddp_device_ids_on_the_host(world1):
    model = torch.nn.Linear(3, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=0)
    assert ddp.device_ids is None
    out = ddp(torch.ones(1, 3))
    out.sum().backward()
    torch.testing.assert_close(model.weight.grad, torch.ones(2, 3))


def test_remove_leaves_copies_of_an_added_name_alone(cpu_settings):
    # a module that picked up the added ProcessGroupNCCL while patched keeps it after remove()
    import sys
    import types

    holder = types.ModuleType("holder_of_added_names")
    sys.modules[holder.__name__] = holder
    try:
        ascend_patch.apply(cpu_settings)
        holder.PG = dist.ProcessGroupNCCL
        ascend_patch.remove()
        from ascend_patch.comm import nccl_options  # ascend_patch's own modules are never re-bound

        assert holder.PG is nccl_options.ProcessGroupNCCL and isinstance(holder.PG, type)
        assert ProcessGroupNCCL is nccl_options.ProcessGroupNCCL  # this module's copy too
        assert not hasattr(dist, "ProcessGroupNCCL")
    finally:
        ascend_patch.remove()
        del sys.modules[holder.__name__]
