"""torch.compile of code moved to "cuda" compiles for the target's real device (issue 23, item 1).

With triton importable (every CUDA build of torch installs it) the patched ``is_available()`` made
Inductor take the host for a GPU and ask triton's CUDA driver, which fails without libcuda.so.
triton's presence is the test double in fake_triton/ (it fails the same way the real wheel does);
torch caches its triton probes, so each case runs in a fresh process (compile_child.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ascend_patch
from ascend_patch.config import Settings
from helpers import REPO, child_env

HERE = os.path.join(REPO, "tests", "adaptors")
FAKE_TRITON = os.path.join(HERE, "fake_triton")
FAKE_TORCH_NPU = os.path.join(HERE, "fake_torch_npu")
ATOL = 1e-5


def run_child(*paths: str, **env: str) -> dict:
    environ = child_env(ASCEND_PATCH_REPORT="1", **env)
    environ["PYTHONPATH"] = os.pathsep.join([*paths, environ["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-m", "ascend_patch", os.path.join(HERE, "compile_child.py")],
                          capture_output=True, text=True, env=environ, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def assert_equal_to_eager(out: dict) -> None:
    assert out["max_diff"] <= ATOL and out["grad_diff"] <= ATOL and out["fn_diff"] <= ATOL, out


def test_compile_with_triton_importable_runs_inductor_on_the_host():
    out = run_child(FAKE_TRITON, ASCEND_PATCH_DEVICE="cpu")
    assert out["triton"] and out["cuda_available"]  # what made Inductor ask triton's CUDA driver
    assert out["param_device"] == "cpu" and out["out_device"] == "cpu"
    assert_equal_to_eager(out)
    assert out["warnings"] == []
    assert out["rows"] == {  # the migration report says which compiler ran
        "torch.compile (Inductor, C++ on the host)": [2, "translated"],
        "torch.compile (Inductor, C++ on the host; mode='max-autotune' without CUDA graphs)": [1, "translated"],
    }


def test_compile_without_a_cpp_compiler_runs_eagerly_with_one_warning():
    out = run_child(FAKE_TRITON, ASCEND_PATCH_DEVICE="cpu", CXX="/nonexistent/c++")
    assert_equal_to_eager(out)
    assert len(out["warnings"]) == 1, out["warnings"]  # three torch.compile calls, one warning
    assert "runs the model eagerly on the cpu target" in out["warnings"][0]
    assert "needs a C++ compiler and found none (searched: /nonexistent/c++; set CXX or install g++)" in \
        out["warnings"][0]
    assert out["rows"] == {"torch.compile (eager: no C++ compiler)": [3, "emulated"]}


def test_compile_on_npu_without_an_inductor_backend_runs_eagerly_with_one_warning():
    out = run_child(FAKE_TORCH_NPU, ASCEND_PATCH_DEVICE="npu")
    assert out["target"] == "npu" and out["param_device"] == "npu:0" and out["out_device"] == "npu:0"
    assert_equal_to_eager(out)
    assert len(out["warnings"]) == 1 and "torchair.get_npu_backend()" in out["warnings"][0], out["warnings"]
    assert out["rows"] == {"torch.compile (eager: no Inductor backend for npu)": [3, "emulated"]}


def test_compile_on_npu_asks_torch_npu_to_register_its_inductor_backend_first():
    out = run_child(FAKE_TORCH_NPU, ASCEND_PATCH_DEVICE="npu", COMPILE_CHILD_REGISTER_NPU_INDUCTOR="1")
    assert out["warnings"] == []
    assert out["rows"] == {"torch.compile (Inductor, its npu backend)": [1, "translated"]}


def test_a_named_backend_is_left_alone(patched):
    calls = []

    def backend(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm.forward

    fn = torch.compile(lambda t: t * 3 + 1, backend=backend)
    x = torch.arange(4.0, device="cuda")
    assert torch.equal(fn(x), x * 3 + 1) and calls == [1]


def test_remove_restores_torch_compile_and_has_triton_by_identity():
    import torch._dynamo.utils  # holds a by-value copy of has_triton, re-bound while patched
    import torch.utils._triton as triton_utils

    compile_, has_triton = torch.compile, triton_utils.has_triton
    with ascend_patch.patched(Settings(device="cpu")):
        assert torch.compile is not compile_ and triton_utils.has_triton is not has_triton
        assert torch._dynamo.utils.has_triton is triton_utils.has_triton
        assert triton_utils.has_triton() is False
    assert torch.compile is compile_ and triton_utils.has_triton is has_triton
    assert torch._dynamo.utils.has_triton is has_triton


@pytest.mark.parametrize("row", ["torch.compile", "torch.utils._triton.has_triton"])
def test_the_patch_table_lists_the_compile_patches(patched, row):
    assert row in {s.patch.shown_as for s in patched.rows("applied")}
