"""Device translation in factory functions and Tensor/Module methods, with CUDA's copy semantics."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from ascend_patch.adaptors.device.factories import derive_device_functions
from ascend_patch.backend import cpu_backend
from ascend_patch.devices import NOT_A_DEVICE, DeviceMap


def test_device_map_is_exact():
    dmap = DeviceMap(cpu_backend())
    cpu = torch.device("cpu")
    for value in ("cuda", "cuda:0", "cuda:7", torch.device("cuda"), torch.device("cuda", 3), 0, 5):
        assert dmap(value) == cpu, value
    for value in ("/data/cuda/ckpt.pt", "cudax", "cuda:", "cuda:1:2", "my_cuda", "CUDA", "cpu", "meta",
                  torch.device("meta"), True, 1.0, None):
        assert dmap.lookup(value) is NOT_A_DEVICE, value
    assert dmap.lookup(3, ints=False) is NOT_A_DEVICE


def test_derived_list_covers_the_factories():
    names = {f"{m}.{a}" for m, a in derive_device_functions()}
    expected = {"torch.zeros", "torch.empty", "torch.ones", "torch.full", "torch.arange", "torch.randn",
                "torch.rand", "torch.randint", "torch.randperm", "torch.eye", "torch.linspace", "torch.tensor",
                "torch.as_tensor", "torch.asarray", "torch.zeros_like", "torch.empty_strided",
                "torch.Tensor.new_zeros", "torch.Tensor.new_tensor", "torch.Tensor.new_full",
                "torch.fft.fftfreq", "torch.sparse_coo_tensor", "torch.tril_indices", "torch.hann_window",
                "torch.nested.nested_tensor"}
    assert expected <= names
    assert "torch.add" not in names and "torch.matmul" not in names


def test_every_derived_function_is_wrapped(patched):
    import importlib

    for module, attr in derive_device_functions():
        owner = importlib.import_module(module)
        for part in attr.split(".")[:-1]:
            owner = getattr(owner, part)
        fn = getattr(owner, attr.split(".")[-1])
        assert hasattr(fn, "__wrapped__"), f"{module}.{attr} is not wrapped"
    assert not hasattr(torch.add, "__wrapped__")  # ops without a device argument stay untouched


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1", torch.device("cuda"), torch.device("cuda", 1), 0])
def test_factories_translate(patched, device):
    assert torch.zeros(2, device=device).device.type == "cpu"
    assert torch.arange(3, device=device).tolist() == [0, 1, 2]
    assert torch.full((2,), 7.0, device=device).tolist() == [7.0, 7.0]
    assert torch.tensor([1, 2], device=device).tolist() == [1, 2]
    assert torch.eye(2, device=device).trace().item() == 2.0
    assert torch.ones(2).new_zeros(3, device=device).tolist() == [0.0, 0.0, 0.0]
    assert torch.fft.fftfreq(4, device=device).tolist() == [0.0, 0.25, -0.5, -0.25]
    assert torch.zeros_like(torch.ones(2), device=device).sum().item() == 0.0


def test_meta_device_construction_still_works(patched):
    with torch.device("meta"):
        layer = nn.Linear(4, 4)
        t = torch.zeros(3)
    assert layer.weight.is_meta and t.is_meta
    torch.set_default_device("cuda")
    try:
        assert torch.zeros(1).device.type == "cpu"
    finally:
        torch.set_default_device(None)


def test_tensor_cuda_is_a_copy(patched):
    host = torch.arange(4.0)
    dev = host.cuda()
    assert dev is not host and dev.device.type == "cpu"
    host += 10
    assert dev.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert host.cuda(1).tolist() == host.tolist()
    assert host.cuda(non_blocking=True).data_ptr() != host.data_ptr()
    # "already on the device" cannot be told from "on the host" on this target: it stays a copy
    assert dev.cuda() is not dev and dev.to("cuda") is not dev
    assert dev.cuda().data_ptr() != dev.data_ptr()


def test_legacy_cuda_tensor_types(patched):
    uninitialised = torch.cuda.FloatTensor(2, 3)
    assert uninitialised.shape == (2, 3) and uninitialised.dtype == torch.float32
    longs = torch.cuda.LongTensor([1, 2])
    assert longs.tolist() == [1, 2] and longs.dtype == torch.int64
    assert torch.cuda.HalfTensor([0.5]).dtype == torch.float16
    assert torch.cuda.FloatTensor().shape == (0,)
    assert isinstance(uninitialised, torch.cuda.FloatTensor) and isinstance(longs, torch.cuda.LongTensor)
    assert not isinstance(longs, torch.cuda.FloatTensor) and not isinstance(torch.ones(1, device="meta"),
                                                                              torch.cuda.FloatTensor)
    assert longs.type() == "torch.cuda.LongTensor"
    assert torch.ones(1).type(torch.cuda.HalfTensor).dtype == torch.float16
    assert torch.cuda.FloatTensor.dtype == torch.float32 and torch.cuda.FloatTensor.is_cuda


def test_legacy_cuda_storage_types(patched):
    floats = torch.cuda.FloatStorage(3)
    assert (len(floats), floats.dtype, floats.device.type) == (3, torch.float32, "cpu")
    longs = torch.cuda.LongStorage([1, 2])
    assert longs.tolist() == [1, 2] and longs.dtype == torch.int64
    assert isinstance(floats, torch.cuda.FloatStorage) and isinstance(longs, torch.cuda.LongStorage)
    assert not isinstance(longs, torch.cuda.FloatStorage) and not isinstance(torch.ones(1), torch.cuda.FloatStorage)
    assert torch.cuda.BFloat16Storage.dtype == torch.bfloat16


@pytest.mark.parametrize("spelling", ["torch.cuda.DoubleTensor", "type"])
def test_set_default_tensor_type_cuda(patched, spelling):
    t = torch.cuda.DoubleTensor if spelling == "type" else spelling
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch deprecates set_default_tensor_type itself
            torch.set_default_tensor_type(t)
        made = torch.tensor([1.5])
        assert (made.dtype, made.device.type, torch.get_default_dtype()) == (torch.float64, "cpu", torch.float64)
        assert isinstance(torch.zeros(1), torch.cuda.DoubleTensor)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_default_tensor_type(torch.FloatTensor)
    assert torch.get_default_dtype() == torch.float32


def test_legacy_types_restored(cpu_settings):
    import ascend_patch

    before = {name: getattr(torch.cuda, name) for name in ("FloatTensor", "LongTensor", "BoolTensor", "FloatStorage")}
    set_default = torch.set_default_tensor_type
    with ascend_patch.patched(cpu_settings):
        assert all(getattr(torch.cuda, name) is not obj for name, obj in before.items())
        assert torch.set_default_tensor_type is not set_default
    assert all(getattr(torch.cuda, name) is obj for name, obj in before.items())
    assert torch.set_default_tensor_type is set_default
    with pytest.raises((RuntimeError, TypeError, AssertionError)):
        torch.cuda.FloatTensor(2)  # this torch has no CUDA: the legacy type is torch's own again


def test_device_context_manager(patched):
    with torch.device("cuda"):
        made = torch.zeros(2)
        layer = nn.Linear(2, 2)
    assert made.device.type == "cpu" and made.tolist() == [0.0, 0.0] and layer.weight.device.type == "cpu"
    with torch.device("cuda:1"):
        assert torch.ones(1).device.type == "cpu"
        assert torch.get_default_device().type == "cpu"
    with torch.device("meta"):  # other devices are untouched
        assert torch.zeros(1).is_meta


def test_device_context_manager_restored(cpu_settings):
    import ascend_patch
    import torch.utils._device as torch_device

    original = torch_device.DeviceContext.__init__
    with ascend_patch.patched(cpu_settings):
        assert torch_device.DeviceContext.__init__ is not original
    assert torch_device.DeviceContext.__init__ is original
    with pytest.raises((RuntimeError, AssertionError, NotImplementedError)):
        with torch.device("cuda"):
            torch.zeros(1)


@pytest.mark.parametrize("move", [
    lambda t: t.to("cuda"), lambda t: t.to("cuda:0"), lambda t: t.to(torch.device("cuda", 0)),
    lambda t: t.to(device="cuda"), lambda t: t.to("cuda", torch.float32), lambda t: t.to(0),
    lambda t: t.cpu(), lambda t: t.to("cpu"), lambda t: t.to(torch.device("cpu")),
])
def test_transfers_never_alias(patched, move):
    staging = torch.zeros(3)
    moved = move(staging)
    staging.fill_(5.0)  # refilling the staging buffer must not change what was transferred
    assert moved.tolist() == [0.0, 0.0, 0.0]


def test_to_dtype_and_to_tensor_are_untouched(patched):
    t = torch.ones(2)
    assert t.to(torch.float32) is t
    assert t.to(torch.float64).dtype == torch.float64
    other = torch.zeros(1, dtype=torch.float16)
    assert t.to(other).dtype == torch.float16


def test_module_moves(patched):
    model = nn.Linear(3, 2)
    weight = model.weight
    assert model.cuda() is model and model.weight is weight
    assert model.to("cuda:0") is model and model.weight is weight
    assert model.to(torch.device("cuda"), torch.float64).weight.dtype == torch.float64
    with torch.device("meta"):
        lazy = nn.Linear(3, 2)
    lazy.to_empty(device="cuda")
    assert lazy.weight.device.type == "cpu"


def test_is_cuda_and_type_strings(patched):
    t = torch.ones(2)
    assert t.is_cuda is True
    assert nn.Parameter(t).is_cuda is True
    assert t.type() == "torch.cuda.FloatTensor"
    assert t.half().type() == "torch.cuda.HalfTensor"
    assert t.type("torch.cuda.HalfTensor").dtype == torch.float16
    assert t.type(torch.cuda.DoubleTensor).dtype == torch.float64
    assert t.type(torch.int32).dtype == torch.int32
    assert torch.empty(1, device="meta").is_cuda is False


def test_type_strings_restored(cpu_settings):
    import ascend_patch

    with ascend_patch.patched(cpu_settings):
        pass
    assert torch.ones(1).type() == "torch.FloatTensor" and torch.ones(1).is_cuda is False


def test_pin_memory(patched):
    t = torch.arange(3.0)
    pinned = t.pin_memory()
    assert pinned.is_pinned() and not t.is_pinned()
    t.add_(1)
    assert pinned.tolist() == [0.0, 1.0, 2.0]


def test_generator_on_cuda_keeps_isinstance(patched):
    g = torch.Generator(device="cuda")
    assert isinstance(g, torch.Generator) and isinstance(g, torch._C.Generator)
    assert g.device.type == "cpu"
    g.manual_seed(3)
    a = torch.randn(4, generator=g, device="cuda")
    g2 = torch.Generator("cuda").manual_seed(3)
    assert torch.equal(a, torch.randn(4, generator=g2))
    assert isinstance(torch.Generator(), torch.Generator)
    assert torch.Generator.manual_seed is torch._C.Generator.manual_seed


def test_storage_cuda(patched):
    storage = torch.arange(3.0).untyped_storage()
    assert storage.cuda().device.type == "cpu"


def test_torchscript_still_sees_builtins(patched):
    @torch.jit.script
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.zeros(2)

    assert f(torch.ones(2)).tolist() == [1.0, 1.0]


def test_data_parallel_runs_the_module(patched):
    model = nn.Linear(3, 1)
    dp = nn.DataParallel(model)
    x = torch.randn(4, 3, device="cuda")
    assert torch.equal(dp(x), model(x))


@pytest.mark.slow
def test_torch_compile_under_the_patch(patched):
    """Inductor reads torch.cuda device properties while compiling for the host."""
    @torch.compile
    def f(x):
        return x * 2 + torch.ones(4, device="cuda")

    assert f(torch.ones(4, device="cuda")).tolist() == [3.0, 3.0, 3.0, 3.0]


def test_applying_the_legacy_storage_patches_warns_nothing(cpu_settings):
    import ascend_patch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ascend_patch.patched(cpu_settings):
            pass
    assert [str(w.message) for w in caught if "TypedStorage" in str(w.message)] == []
