"""Child process for test_npu_target.py: CUDA code run through the PATCHED PUBLIC APIs on the npu target.

The npu target here is the test double (fake_torch_npu/torch_npu + npu_tensor_double):
tensors really carry ``npu:N`` devices, their data is host memory. The privateuse1
rename it needs cannot be undone, hence a child process. Prints one JSON line:
{group: {name: value}}; a group that raised holds {"error": traceback}.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "fake_torch_npu")]

os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
for _name in ("ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF", "ASCEND_LAUNCH_BLOCKING"):
    os.environ.pop(_name, None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ascend_patch  # noqa: E402
from ascend_patch.config import Settings  # noqa: E402
from ascend_patch.patch import PatchKind  # noqa: E402

_MISSING = object()


def dev(t) -> str:
    return str(t.device)


def selection(report) -> dict:
    import torch_npu

    return {
        "target": report.target, "reason": report.reason, "plugin_failures": report.plugin_failures,
        "failed": [f"{s.patch.shown_as}: {s.detail}" for s in report.rows("failed")],
        "import_env": torch_npu.IMPORT_ENV["ASCEND_RT_VISIBLE_DEVICES"],
        "count_env": torch.npu.visible_at_first_count,
        "env_now": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
        "env_status": report.statuses[[s.patch.target for s in report.statuses].index(
            "ASCEND_RT_VISIBLE_DEVICES")].detail,
    }


def transfers() -> dict:
    out = {"zeros": dev(torch.zeros(2, device="cuda")), "zeros_values": torch.zeros(2, device="cuda").cpu().tolist()}
    moved = torch.arange(3.0).to("cuda:1")
    out["to_cuda1"], out["to_cuda1_values"] = dev(moved), moved.cpu().tolist()
    out["to_same_is_self"] = moved.to("cuda:1") is moved
    out["to_kw"] = dev(torch.ones(1).to(device=torch.device("cuda", 2)))
    host = torch.arange(3.0)
    on = host.cuda()
    out["cuda"], out["cuda_values"] = dev(on), on.cpu().tolist()
    out["cuda_again_is_self"] = on.cuda() is on
    out["cuda_to_is_self"] = on.to("cuda") is on and on.to("cuda:0") is on
    out["cuda_other_index"] = dev(on.cuda(1))
    out["cuda_other_is_copy"] = on.cuda(1) is not on
    torch.cuda.set_device(1)
    try:
        out["cuda_after_set_device"] = dev(torch.ones(1).cuda())
        out["current_device"] = torch.cuda.current_device()
    finally:
        torch.cuda.set_device(0)
    out["is_cuda"] = [on.is_cuda, host.is_cuda]
    out["type"] = [on.type(), on.half().type(), host.type()]
    out["type_convert"] = dev(on.type("torch.cuda.HalfTensor")), str(on.type(torch.cuda.DoubleTensor).dtype)
    model = nn.Linear(2, 2)
    out["module_cuda_is_self"] = model.cuda() is model
    out["module_cuda"] = dev(model.weight)
    out["module_to"] = dev(nn.Linear(2, 2).to("cuda:1").weight)
    out["module_to_empty"] = dev(nn.Linear(2, 2, device="meta").to_empty(device="cuda").weight)
    return out


def factories() -> dict:
    out = {"full": [dev(torch.full((2,), 7.0, device="cuda:1")), torch.full((2,), 7.0, device="cuda:1").cpu().tolist()],
           "arange": dev(torch.arange(3, device=torch.device("cuda", 2))),
           "tensor": [dev(torch.tensor([1, 2], device="cuda")), torch.tensor([1, 2], device="cuda").cpu().tolist()],
           "new_zeros": dev(torch.ones(1).new_zeros(2, device="cuda:1")),
           "int_index": dev(torch.empty(1, device=3))}
    torch.set_default_device("cuda")
    try:
        out["set_default_device"] = dev(torch.zeros(1))
    finally:
        torch.set_default_device(None)
    with torch.device("cuda:1"):
        out["device_context"] = [dev(torch.zeros(1)), dev(nn.Linear(2, 2).weight)]
    out["after_context"] = dev(torch.zeros(1))
    return out


def legacy() -> dict:
    f = torch.cuda.FloatTensor(2)
    long = torch.cuda.LongTensor([1, 2])
    return {"float": [dev(f), list(f.shape), str(f.dtype)], "long": [dev(long), long.cpu().tolist(), str(long.dtype)],
            "isinstance": [isinstance(f, torch.cuda.FloatTensor), isinstance(long, torch.cuda.LongTensor),
                           isinstance(long, torch.cuda.FloatTensor), isinstance(torch.ones(2), torch.cuda.FloatTensor)],
            "type": long.type()}


def load() -> dict:
    import torch.serialization as ser
    import torch_npu

    tags, real_tag = iter(["cuda:3", "cuda:0"]), ser.location_tag
    ser.location_tag = lambda storage: next(tags, real_tag(storage))
    buf = io.BytesIO()
    try:
        torch.save({"w": torch.arange(4.0), "b": torch.ones(2)}, buf)
    finally:
        ser.location_tag = real_tag
    out = {}
    forms = {"None": None, "'cuda'": "cuda", "'cuda:1'": "cuda:1", "device('cuda', 2)": torch.device("cuda", 2),
             "1": 1, "dict": {"cuda:3": "cuda:1"}, "callable->None": lambda storage, location: None}
    for name, form in forms.items():
        buf.seek(0)
        del torch_npu.RESTORED[:]
        state = torch.load(buf, map_location=form, weights_only=True)
        out[name] = [list(torch_npu.RESTORED), state["w"].tolist(), state["b"].tolist()]
    return out


def amp() -> dict:
    out = {}
    a = torch.randn(2, 2, device="cuda")
    with torch.autocast("cuda"):
        out["in_autocast"] = [torch.is_autocast_enabled("npu"), torch.is_autocast_enabled("cuda"),
                              str(torch.get_autocast_dtype("npu")), str(torch.get_autocast_gpu_dtype())]
        out["op_device"] = dev(a @ a)
    out["after"] = torch.is_autocast_enabled("npu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with torch.cuda.amp.autocast():
            out["cuda_amp_autocast"] = [torch.is_autocast_enabled("npu"), str(torch.get_autocast_dtype("npu"))]
        out["cuda_amp_scaler"] = torch.cuda.amp.GradScaler()._device
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    out["scaler_device"] = scaler._device
    torch.manual_seed(0)
    model = nn.Linear(2, 1).cuda()
    before = model.weight.detach().cpu().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(1, 2, device="cuda")).sum()
    scaled = scaler.scale(loss)
    out["scaled"] = [dev(scaled), round(scaled.item() / loss.item(), 3)]
    scaled.backward()
    out["grad"] = [dev(model.weight.grad), (model.weight.grad.cpu() / 1024.0).tolist()]
    scaler.step(opt)
    scaler.update()
    out["step"] = torch.allclose(model.weight.detach().cpu(), before - 0.1 * torch.ones(1, 2))
    out["scale"] = scaler.get_scale()
    return out


def data_and_parallel() -> dict:
    import torch_npu
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2, pin_memory=True, pin_memory_device="cuda")
    out = {"loader": [loader.pin_memory, loader.pin_memory_device]}
    out["probe"] = torch._utils._get_available_device_type()
    dp = nn.DataParallel(nn.Linear(2, 1), device_ids=[0])
    out["data_parallel"] = [str(dp.src_device_obj), dev(dp.module.weight)]
    del torch_npu.GENERATORS[:]
    g = torch.Generator(device="cuda:1")
    out["generator"] = [list(torch_npu.GENERATORS), isinstance(g, torch.Generator), isinstance(g, torch._C.Generator)]
    return out


def accelerator() -> dict:
    """torch_npu's own accelerator (privateuse1 "npu") stays; both namespaces give one answer."""
    acc = torch.accelerator
    out = {"current": str(acc.current_accelerator()), "available": acc.is_available(),
           "counts": [acc.device_count(), torch.cuda.device_count()]}
    acc.set_device_index("cuda:1")  # a CUDA device names the NPU with the same index
    out["after_cuda1"] = [acc.current_device_index(), torch.cuda.current_device()]
    torch.cuda.set_device(0)
    out["after_cuda_set_device0"] = [acc.current_device_index(), torch.cuda.current_device()]
    acc.set_device_index(torch.device("npu", 1))
    out["after_npu1"] = [acc.current_device_index(), torch.cuda.current_device()]
    torch.cuda.set_device(0)
    return out


def flags() -> dict:
    npu = torch.npu
    matmul = torch.backends.cuda.matmul
    out = {"defaults": [matmul.allow_tf32, torch.backends.cudnn.allow_tf32]}
    matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = False
    out["npu_after_set"] = [npu.matmul.allow_hf32, npu.conv.allow_hf32]
    npu.matmul.allow_hf32 = False
    out["read_back"] = [matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
    out["other_cublas_flag"] = isinstance(matmul.allow_fp16_reduced_precision_reduction, bool)
    npu.conv.allow_hf32 = True
    return out


def cuda_namespace() -> dict:
    return {"count": torch.cuda.device_count(), "available": torch.cuda.is_available(),
            "bf16": torch.cuda.is_bf16_supported(),
            "spawn": ascend_patch.report().statuses[[s.patch.target for s in ascend_patch.report().statuses].index(
                "torch.multiprocessing.spawn:start_processes")].state}


def _owner(target: str):
    module, attr = target.split(":", 1)
    owner = sys.modules.get(module) or importlib.import_module(module)
    parts = attr.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def identity(targets: list[str], added: list[str]) -> dict:
    """Apply again on npu and remove: every original back by identity."""
    before = {}
    for target in targets:
        owner, name = _owner(target)
        before[target] = (owner, name, vars(owner).get(name, _MISSING), getattr(owner, name, _MISSING))
    flag_before = torch.backends.cuda.matmul.allow_tf32
    report = ascend_patch.apply(Settings(device="npu"))
    try:
        applied = sorted(s.patch.target for s in report.rows("applied")
                         if s.patch.kind in (PatchKind.REPLACE, PatchKind.WRAP))
        unchanged = [t for t, (o, n, own, _) in before.items() if vars(o).get(n, _MISSING) is own]
    finally:
        ascend_patch.remove()
    not_restored = [t for t, (o, n, own, value) in before.items()
                    if vars(o).get(n, _MISSING) is not own or getattr(o, n, _MISSING) is not value]
    added_left = [t for t in added if vars(_owner(t)[0]).get(_owner(t)[1], _MISSING) is not _MISSING]
    npu = torch.npu
    torch.backends.cuda.matmul.allow_tf32 = not flag_before  # torch's own flag again, not the NPU switch
    hf32 = npu.matmul.allow_hf32
    torch.backends.cuda.matmul.allow_tf32 = flag_before
    return {"count": len(targets), "same_table": applied == sorted(targets), "unchanged_while_applied": unchanged,
            "not_restored": not_restored, "added_left": added_left, "flag_untouched_after_remove": hf32 is False,
            "legacy_type_after": type(torch.cuda.FloatTensor).__name__,
            "env_after": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), "active": ascend_patch.active_backend()}


def main() -> None:
    out: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ascend_patch.apply(Settings(device="auto"))  # imports the torch_npu double
    out["warnings"] = [str(w.message) for w in caught if "ascend_patch" in str(w.message)]
    try:
        for group in (lambda: selection(report), transfers, factories, legacy, load, amp, data_and_parallel, flags,
                      cuda_namespace, accelerator):
            name = "selection" if group.__name__ == "<lambda>" else group.__name__
            try:
                out[name] = group()
            except Exception:
                out[name] = {"error": traceback.format_exc()}
    finally:
        # what is applied by now, deferred patches included (the groups import modules such as DTensor's)
        applied = ascend_patch.report().rows("applied")
        targets = [s.patch.target for s in applied if s.patch.kind in (PatchKind.REPLACE, PatchKind.WRAP)]
        added = [s.patch.target for s in applied if s.patch.kind is PatchKind.ADD]
        ascend_patch.remove()
    out["env_after_remove"] = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    try:
        out["identity"] = identity(targets, added)
    except Exception:
        out["identity"] = {"error": traceback.format_exc()}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
