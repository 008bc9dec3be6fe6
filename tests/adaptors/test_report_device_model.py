"""The migration report on the device model: torch.accelerator calls, CPU fallback, the program's call sites."""

from __future__ import annotations

import sys

import torch

import ascend_patch
from ascend_patch.config import Settings


def uses() -> dict:
    return {u.api: u for u in ascend_patch.report().uses}


def test_the_first_call_site_is_the_program_s_line_not_torch_s():
    with ascend_patch.patched(Settings(device="cpu", report="1")):
        torch.manual_seed(0)  # torch/random.py calls torch.cuda.manual_seed_all
        line = sys._getframe().f_lineno - 1
        assert uses()["torch.cuda.manual_seed_all"].first_site == f"{__file__}:{line}"


def test_a_call_torch_makes_inside_a_patched_function_is_charged_to_the_program():
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    with ascend_patch.patched(Settings(device="cpu", report="1")):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        try:
            # the patched DeviceMesh.__init__ runs torch's, which asks torch.cuda.is_available():
            # that use is the program's line, not ascend_patch's frame between them
            DeviceMesh("cuda", [0])
            line = sys._getframe().f_lineno - 1
            assert uses()["torch.cuda.is_available"].first_site == f"{__file__}:{line}"
        finally:
            dist.destroy_process_group()


def test_torch_accelerator_calls_are_named_and_a_gpu_path_is_no_fallback():
    with ascend_patch.patched(Settings(device="cpu", report="1")):
        device = torch.accelerator.current_accelerator()
        line = sys._getframe().f_lineno - 1
        torch.zeros(2, device=device)
        found = uses()
        assert found["torch.accelerator.current_accelerator"].first_site == f"{__file__}:{line}"
        assert found["torch.accelerator.current_accelerator"].action == "emulated"
        assert ascend_patch.report().cpu_fallback() == ""


def test_a_program_that_asked_and_took_its_cpu_path_is_reported():
    with ascend_patch.patched(Settings(device="cpu", report="1", cuda_is_available=False)):
        device = "cuda" if torch.accelerator.is_available() else "cpu"
        line = sys._getframe().f_lineno - 1
        torch.zeros(2, device=device)
        report = ascend_patch.report()
        note = report.cpu_fallback()
        assert note.startswith("CPU fallback: the program asked for a GPU (torch.accelerator.is_available at "
                               f"{__file__}:{line}), was told there is none (ASCEND_PATCH_CUDA_IS_AVAILABLE=0)")
        assert "Unset ASCEND_PATCH_CUDA_IS_AVAILABLE" in note and note in report.usage_table()


def test_asked_with_a_gpu_available_and_still_no_gpu_use():
    with ascend_patch.patched(Settings(device="cpu", report="1")):
        if torch.cuda.is_available() and False:  # a script whose own switch (a --cpu flag) wins
            pass
        torch.zeros(2)
        assert "it most likely took its CPU path" in ascend_patch.report().cpu_fallback()
