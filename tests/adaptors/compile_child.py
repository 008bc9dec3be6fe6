"""Child process for test_compile.py: ``torch.compile`` of a model moved to "cuda", under the patch.

Run as ``python -m ascend_patch compile_child.py`` with ASCEND_PATCH_REPORT=1: the target comes
from the environment (ASCEND_PATCH_DEVICE; the npu target is the test double in fake_torch_npu/
on PYTHONPATH). triton's presence comes from the test double in fake_triton/ on PYTHONPATH:
torch caches its triton probes, so only a fresh process sees it. Prints one JSON line: what ran, the outputs' largest difference from eager,
the warnings ascend_patch raised and the migration report's torch.compile rows.
"""

from __future__ import annotations

import json
import os
import sys
import types
import warnings

import torch
import torch.nn as nn

import ascend_patch
from ascend_patch.usage import active_recorder


def host(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "host", t)  # the npu double's tensors hold their data in .host


def compiled_rows() -> dict:
    return {u.api: [u.calls, u.action] for u in active_recorder().uses() if u.api.startswith("torch.compile")}


out: dict = {"target": ascend_patch.report().target, "cuda_available": torch.cuda.is_available()}
try:
    import triton  # noqa: F401

    out["triton"] = True
except ImportError:
    out["triton"] = False

if os.environ.get("COMPILE_CHILD_REGISTER_NPU_INDUCTOR") == "1":
    # what torch_npu does on the first compiled graph: torch_npu.utils._dynamo.register_inductor_npu()
    # imports torch_npu._inductor, which registers the npu Inductor backend
    def register_inductor_npu() -> None:
        from torch._inductor.codegen.common import register_backend_for_device
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen

        register_backend_for_device("npu", CppScheduling, PythonWrapperCodegen)

    for name in ("torch_npu.utils", "torch_npu.utils._dynamo"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torch_npu.utils._dynamo"].register_inductor_npu = register_inductor_npu
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(nn.Linear(2, 2).cuda())  # lazy: nothing is traced until it is called
    out["warnings"] = [str(w.message) for w in caught if "ascend_patch" in str(w.message)]
    out["rows"] = compiled_rows()
    print(json.dumps(out))
    sys.exit(0)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).cuda()
x = torch.randn(6, 8, device="cuda")
out["param_device"] = str(next(model.parameters()).device)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    eager = model(x)
    eager.sum().backward()
    eager_grads = [host(p.grad).clone() for p in model.parameters()]
    model.zero_grad()

    compiled = torch.compile(model)
    got = compiled(x)
    got.sum().backward()
    again = torch.compile(model, mode="max-autotune")(x)  # a second compile: no second warning
    decorated = torch.compile(lambda t: torch.nn.functional.gelu(t) * 2)(x)

out["warnings"] = [str(w.message) for w in caught if "ascend_patch" in str(w.message)]
out["out_device"] = str(got.device)
out["max_diff"] = max((host(got) - host(eager)).abs().max().item(), (host(again) - host(eager)).abs().max().item())
out["grad_diff"] = max((host(p.grad) - g).abs().max().item() for p, g in zip(model.parameters(), eager_grads))
out["fn_diff"] = (host(decorated) - host(torch.nn.functional.gelu(x) * 2)).abs().max().item()
out["rows"] = compiled_rows()
print(json.dumps(out))
