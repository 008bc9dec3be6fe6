"""The npu target through the patched public APIs, on the torch_npu test double (see npu_child.py).

The double (fake_torch_npu/torch_npu, npu_tensor_double) gives tensors a real ``npu:N``
device backed by host memory; where it cannot hold something (npu storages for
torch.load, npu generators) it records what the patched API asked for. Nothing here
ran on an NPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, child_env


@pytest.fixture(scope="module")
def npu():
    done = subprocess.run([sys.executable, os.path.join(REPO, "tests", "adaptors", "npu_child.py")],
                          capture_output=True, text=True, env=child_env(ASCEND_PATCH="0"), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    def group(name):
        result = out[name]
        assert "error" not in result, result["error"] if isinstance(result, dict) else result
        return result

    group.raw = out
    return group


def test_auto_applies_the_npu_target_with_no_plugin_failure(npu):
    sel = npu("selection")
    assert sel["target"] == "npu" and sel["reason"] == "auto: torch_npu sees 8 NPU device(s)"
    assert sel["plugin_failures"] == [] and sel["failed"] == []
    assert npu.raw["warnings"] == []


def test_visible_devices_are_mapped_before_torch_npu_is_imported_and_probed(npu):
    sel = npu("selection")
    assert sel["import_env"] == "2,3"  # what torch_npu saw when it was imported
    assert sel["count_env"] == "2,3"  # what the probe's device_count() ran with
    assert sel["env_now"] == "2,3"
    assert sel["env_status"] == "ASCEND_RT_VISIBLE_DEVICES=2,3 (set before torch_npu was imported)"
    assert npu.raw["env_after_remove"] is None


def test_transfers_land_on_npu_devices(npu):
    t = npu("transfers")
    assert (t["zeros"], t["zeros_values"]) == ("npu:0", [0.0, 0.0])
    assert (t["to_cuda1"], t["to_cuda1_values"]) == ("npu:1", [0.0, 1.0, 2.0])
    assert t["to_kw"] == "npu:2"
    assert (t["cuda"], t["cuda_values"]) == ("npu:0", [0.0, 1.0, 2.0])
    assert (t["cuda_other_index"], t["cuda_other_is_copy"]) == ("npu:1", True)
    assert (t["cuda_after_set_device"], t["current_device"]) == ("npu:1", 1)
    assert t["module_cuda_is_self"] and t["module_cuda"] == "npu:0"
    assert t["module_to"] == "npu:1" and t["module_to_empty"] == "npu:0"


def test_cuda_on_a_tensor_already_there_returns_it(npu):
    t = npu("transfers")
    assert t["cuda_again_is_self"] is True  # CUDA semantics: no copy when nothing moves
    assert t["cuda_to_is_self"] is True and t["to_same_is_self"] is True


def test_is_cuda_and_type_strings_for_npu_tensors(npu):
    t = npu("transfers")
    assert t["is_cuda"] == [True, False]
    assert t["type"] == ["torch.cuda.FloatTensor", "torch.cuda.HalfTensor", "torch.FloatTensor"]
    assert t["type_convert"] == ["npu:0", "torch.float64"]


def test_factories_default_device_and_device_context(npu):
    f = npu("factories")
    assert f["full"] == ["npu:1", [7.0, 7.0]] and f["arange"] == "npu:2"
    assert f["tensor"] == ["npu:0", [1, 2]] and f["new_zeros"] == "npu:1" and f["int_index"] == "npu:3"
    assert f["set_default_device"] == "npu:0"
    assert f["device_context"] == ["npu:1", "npu:1"] and f["after_context"] == "cpu"


def test_legacy_cuda_tensor_types(npu):
    legacy = npu("legacy")
    assert legacy["float"] == ["npu:0", [2], "torch.float32"]
    assert legacy["long"] == ["npu:0", [1, 2], "torch.int64"]
    assert legacy["isinstance"] == [True, True, False, False]
    assert legacy["type"] == "torch.cuda.LongTensor"


def test_load_restores_storages_onto_npu_for_every_map_location_form(npu):
    load = npu("load")
    values = [[0.0, 1.0, 2.0, 3.0], [1.0, 1.0]]
    expected = {"None": ["npu:3", "npu:0"], "'cuda'": ["npu", "npu"], "'cuda:1'": ["npu:1", "npu:1"],
                "device('cuda', 2)": ["npu:2", "npu:2"], "1": ["npu:1", "npu:1"],
                "dict": ["npu:1", "npu:0"],  # cuda:0 is not listed and still lands on the npu
                "callable->None": ["npu:3", "npu:0"]}
    assert {form: got[0] for form, got in load.items()} == expected
    assert all(got[1:] == values for got in load.values())


def test_autocast_and_grad_scaler_on_npu(npu):
    amp = npu("amp")
    assert amp["in_autocast"] == [True, True, "torch.float16", "torch.float16"]
    assert amp["op_device"] == "npu:0" and amp["after"] is False
    assert amp["cuda_amp_autocast"] == [True, "torch.float16"] and amp["cuda_amp_scaler"] == "npu"
    assert amp["scaler_device"] == "npu"
    assert amp["scaled"] == ["npu:0", 1024.0]
    assert amp["grad"] == ["npu:0", [[1.0, 1.0]]]
    assert amp["step"] is True and amp["scale"] == 1024.0


def test_dataloader_data_parallel_and_generator(npu):
    d = npu("data_and_parallel")
    assert d["loader"] == [True, ""]  # pins for the accelerator torch finds: the npu
    assert d["probe"] == "npu"
    assert d["data_parallel"] == ["npu:0", "npu:0"]
    assert d["generator"] == [["npu:1"], True, True]


def test_tf32_flags_drive_the_npu_hf32_switches(npu):
    flags = npu("flags")
    assert flags["defaults"] == [False, True]  # torch_npu's defaults, read through the CUDA flags
    assert flags["npu_after_set"] == [True, False]
    assert flags["read_back"] == [False, False]
    assert flags["other_cublas_flag"] is True


def test_cuda_namespace_on_npu(npu):
    ns = npu("cuda_namespace")
    assert ns == {"count": 8, "available": True, "bf16": True, "spawn": "applied"}


def test_remove_restores_every_original_by_identity_on_npu(npu):
    ident = npu("identity")
    assert ident["count"] > 150 and ident["same_table"] is True
    assert ident["unchanged_while_applied"] == []
    assert ident["not_restored"] == [] and ident["added_left"] == []
    assert ident["flag_untouched_after_remove"] is True
    assert ident["legacy_type_after"] == "tensortype"
    assert ident["env_after"] is None and ident["active"] is None


def test_torch_npu_keeps_its_accelerator_and_both_namespaces_agree(npu):
    a = npu("accelerator")
    assert a["current"] == "npu" and a["available"] is True
    assert a["counts"] == [8, 8]  # torch.accelerator.device_count(), torch.cuda.device_count()
    assert a["after_cuda1"] == [1, 1]  # set_device_index("cuda:1"): the NPU with the same index
    assert a["after_cuda_set_device0"] == [0, 0]
    assert a["after_npu1"] == [1, 1]
