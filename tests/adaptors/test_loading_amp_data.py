"""torch.load from cuda:N, autocast/GradScaler, DataLoader pinning, process groups and DDP."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn as nn


@pytest.fixture
def cuda_checkpoint(tmp_path, monkeypatch):
    """A checkpoint whose storages are recorded as living on cuda:3 and cuda:0, as a GPU run saves them."""
    import torch.serialization as ser

    tags = iter(["cuda:3", "cuda:0"])
    real_tag = ser.location_tag
    monkeypatch.setattr(ser, "location_tag", lambda storage: next(tags, real_tag(storage)))
    path = tmp_path / "cuda" / "cuda:0.pt"  # a path that contains "cuda" must be used as is
    path.parent.mkdir()
    torch.save({"w": torch.arange(4.0), "b": torch.ones(2)}, path)
    monkeypatch.setattr(ser, "location_tag", real_tag)
    return path


def test_fixture_really_saved_on_cuda(cuda_checkpoint):
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(cuda_checkpoint, weights_only=True)


@pytest.mark.parametrize("map_location", [
    None, "cuda", "cuda:1", torch.device("cuda", 0), 0,
    {"cuda:3": "cuda:0"},  # cuda:0 stays unlisted and must still land on the target
    lambda storage, loc: None,
    lambda storage, loc: storage.cuda(),
    lambda storage, loc: storage,
])
def test_load_saved_on_cuda(patched, cuda_checkpoint, map_location):
    state = torch.load(cuda_checkpoint, map_location=map_location, weights_only=True)
    assert state["w"].tolist() == [0.0, 1.0, 2.0, 3.0] and state["b"].tolist() == [1.0, 1.0]
    assert state["w"].device.type == "cpu"


def test_load_positional_map_location(patched, cuda_checkpoint):
    assert torch.load(cuda_checkpoint, "cuda", weights_only=True)["b"].sum().item() == 2.0


def test_path_named_cuda_is_loaded_from_that_exact_path(patched, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save(torch.tensor([9.0]), "cuda")
    assert torch.load("cuda", map_location="cuda").item() == 9.0
    assert os.path.exists(tmp_path / "cuda")


def test_autocast_cuda_keeps_float16_default(patched):
    a, b = torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda")
    with torch.autocast("cuda"):
        assert (a @ b).dtype == torch.float16
        assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_gpu_dtype() == torch.float16
    assert not torch.is_autocast_enabled()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with torch.cuda.amp.autocast():
            assert (a @ b).dtype == torch.float16


def test_custom_fwd_casts_on_the_target(patched):
    class Square(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    x = torch.ones(3, device="cuda", dtype=torch.float16, requires_grad=True)
    with torch.autocast("cuda"):
        y = Square.apply(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_torch_cuda_amp_wrappers(patched):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)

        class Twice(torch.autograd.Function):
            @staticmethod
            @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, x):
                return x * 2

            @staticmethod
            @torch.cuda.amp.custom_bwd
            def backward(ctx, grad):
                return grad * 2

        x = torch.ones(2, device="cuda", dtype=torch.float16, requires_grad=True)
        with torch.cuda.amp.autocast():
            assert torch.is_autocast_enabled("cuda") and torch.get_autocast_gpu_dtype() == torch.float16
            y = Twice.apply(x)
        assert y.dtype == torch.float32 and y.tolist() == [2.0, 2.0]  # custom_fwd cast inside the region
        y.sum().backward()
        assert x.grad.tolist() == [2.0, 2.0]


def test_grad_scaler_cuda(patched):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    loss = model(torch.ones(1, 2, device="cuda")).sum()
    scaler.scale(loss).backward()
    expected = model.weight.grad.clone() / 1024.0
    before = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.allclose(model.weight.detach(), before - 0.1 * expected)
    assert scaler.get_scale() == 1024.0 * 1.0  # no growth after one step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert torch.cuda.amp.GradScaler()._device == "cpu"


def test_dataloader_pin_memory(patched):
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(6.0).view(3, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoader(data, batch_size=2, pin_memory=True, pin_memory_device="cuda")
        batches = [b[0].tolist() for b in loader]
    assert batches == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0]]]


@pytest.fixture
def flags_only_plugins():
    """A plugin manager holding only the TF32 -> HF32 flag patches (no device patches)."""
    from ascend_patch import plugins
    from ascend_patch.adaptors.device.backend_flags import backend_flag_patches
    from ascend_patch.hookspec import hookimpl

    class FlagsOnly:
        @hookimpl
        def ascend_patch_register_patches(self, backend):
            return backend_flag_patches(backend)

    pm = plugins.PluginManager(entry_points=False, builtins=False)
    pm.register(FlagsOnly(), "flags", origin="test")
    previous = plugins.reset_plugin_manager(pm)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        yield saved
    finally:
        import ascend_patch

        ascend_patch.remove()
        plugins.reset_plugin_manager(previous)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_flags_drive_the_npu_hf32_switches(flags_only_plugins):
    import ascend_patch
    from ascend_patch.backend import Backend
    from ascend_patch.config import Settings
    from npu_double import FakeNpuModule

    fake = FakeNpuModule()
    npu = Backend("npu", "npu", "hccl", fake, keeps_index=True, reason="test double")
    with ascend_patch.patched(Settings(device="npu"), backend=npu) as report:
        assert sorted(s.patch.target for s in report.rows("applied")) == [
            "torch.backends.cuda:cuBLASModule.__getattr__", "torch.backends.cuda:cuBLASModule.__setattr__",
            "torch.backends.cudnn:CudnnModule.allow_tf32"]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, True)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = False
        assert (fake.matmul.allow_hf32, fake.conv.allow_hf32) == (True, False)
        fake.matmul.allow_hf32 = False
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert isinstance(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction, bool)  # others: torch's
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == flags_only_plugins
    torch.backends.cuda.matmul.allow_tf32 = not flags_only_plugins[0]  # torch's own flag again
    assert fake.matmul.allow_hf32 is False and torch.backends.cuda.matmul.allow_tf32 is not flags_only_plugins[0]


def test_tf32_flags_are_left_alone_on_the_host_and_without_switches():
    from ascend_patch.adaptors.device.backend_flags import backend_flag_patches
    from ascend_patch.backend import Backend, cpu_backend

    assert backend_flag_patches(cpu_backend()) == []  # the host has neither TF32 nor HF32
    old_torch_npu = Backend("npu", "npu", "hccl", object(), keeps_index=True)
    assert backend_flag_patches(old_torch_npu) == []  # a torch_npu without the switches: nothing to map


def test_process_group_nccl_becomes_gloo(patched, tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    from ascend_patch.comm.backend_names import real_backend

    try:
        assert real_backend() == "gloo"
        assert dist.get_backend() == "nccl"  # program code that checks the name keeps working
        group = dist.new_group([0], backend="nccl")
        assert real_backend(group) == "gloo"
        mixed = dist.new_group([0], backend="cpu:gloo,cuda:nccl")
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=mixed)
        assert t.tolist() == [1.0, 1.0]
        model = nn.Linear(2, 1).cuda(0)
        ddp = DDP(model, device_ids=[0], output_device=0)
        ddp(torch.ones(3, 2, device="cuda")).sum().backward()
        assert model.weight.grad.tolist() == [[3.0, 3.0]]
    finally:
        dist.destroy_process_group()


def test_translate_backend_forms():
    from ascend_patch.backend import Backend, cpu_backend
    from ascend_patch.comm.backend_names import translate_backend

    cpu = cpu_backend()
    npu = Backend("npu", "npu", "hccl", None, keeps_index=True)
    assert translate_backend("nccl", cpu) == "gloo" and translate_backend("NCCL", npu) == "hccl"
    assert translate_backend("cpu:gloo,cuda:nccl", cpu) == "cpu:gloo"
    assert translate_backend("cpu:gloo,cuda:nccl", npu) == "cpu:gloo,npu:hccl"
    assert translate_backend("gloo", npu) == "gloo" and translate_backend(None, cpu) is None


def _spawned(index, path):
    torch.save({"available": torch.cuda.is_available(), "device": str(torch.zeros(1, device="cuda").device)},
               f"{path}.{index}")


def test_spawned_workers_are_patched(patched, tmp_path):
    torch.multiprocessing.spawn(_spawned, args=(str(tmp_path / "out"),), nprocs=1)
    result = torch.load(f"{tmp_path / 'out'}.0")
    assert result == {"available": True, "device": "cpu"}
