"""How many virtual devices the cpu target presents, why, and launchers that size a run from that count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

from helpers import child_env


def test_one_variable_says_how_many_devices_every_namespace_sees(patched, monkeypatch):
    import ascend_patch
    from ascend_patch.cpu_host import device_source

    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "_ASCEND_PATCH_SPAWN_NPROCS"):
        monkeypatch.delenv(name, raising=False)
    assert device_source()[0] == torch.cuda.device_count() == 1
    assert ascend_patch.report().summary().splitlines()[1] == (
        "virtual devices: 1 (the default: none of CUDA_VISIBLE_DEVICES, ASCEND_PATCH_CPU_DEVICES, an mp.spawn nprocs "
        "or LOCAL_WORLD_SIZE is set; ASCEND_PATCH_CPU_DEVICES=N presents N)")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("ASCEND_PATCH_CPU_DEVICES", "8")  # the node's count wins over the launcher's local world
    assert torch.cuda.device_count() == torch.accelerator.device_count() == 8
    torch.cuda.set_device(7)
    torch.cuda.set_device(0)
    assert ascend_patch.report().summary().splitlines()[1] == "virtual devices: 8 (ASCEND_PATCH_CPU_DEVICES=8)"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # narrows it, as on a GPU node
    assert device_source() == (2, "CUDA_VISIBLE_DEVICES=0,1")
    with pytest.raises(RuntimeError, match=r"invalid device ordinal 2: the cpu target has 2 virtual device\(s\) "
                                           r"\(CUDA_VISIBLE_DEVICES=0,1\); set ASCEND_PATCH_CPU_DEVICES=N"):
        torch.cuda.set_device(2)


def test_the_rule_in_order():
    from ascend_patch.cpu_host import device_source

    assert device_source({"LOCAL_WORLD_SIZE": "4"}) == (4, "LOCAL_WORLD_SIZE=4, from the launcher")
    assert device_source({"LOCAL_WORLD_SIZE": "4", "_ASCEND_PATCH_SPAWN_NPROCS": "3"}) == (
        3, "torch.multiprocessing.spawn(nprocs=3)")
    assert device_source({"LOCAL_WORLD_SIZE": "4", "ASCEND_PATCH_CPU_DEVICES": "8"})[0] == 8
    assert device_source({"ASCEND_PATCH_CPU_DEVICES": "8", "CUDA_VISIBLE_DEVICES": "3"})[0] == 1
    assert device_source({})[0] == 1


def _accelerate_args(*argv):
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser().parse_args([*argv, "train.py"])


@pytest.fixture
def no_accelerate_config(monkeypatch, tmp_path):
    from accelerate.commands import launch

    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "no-default-config.yaml"))


def test_a_worker_accelerate_started_alone_says_why(no_accelerate_config):
    # accelerate's own launcher, unpatched on this CPU host: it sees no GPU and picks its one-process launcher
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    from ascend_patch.adaptors.device.launchers import worker_launch_warning

    args, _, _ = _validate_launch_command(_accelerate_args("--num_processes", "2"))
    assert (args.num_processes, args.multi_gpu) == (2, False)
    _, env = prepare_simple_launcher_cmd_env(args)
    message = worker_launch_warning(env)
    assert message.startswith("ascend_patch: `accelerate launch` started this process alone although it was asked "
                              "for more than one"), message
    assert "ASCEND_PATCH_AUTOLOAD=1 ASCEND_PATCH_CPU_DEVICES=N accelerate launch --num_processes N" in message
    assert worker_launch_warning({**env, "ASCEND_PATCH_AUTOLOAD": "1"}) is None  # a patched launcher warned itself
    one, _, _ = _validate_launch_command(_accelerate_args("--num_processes", "1"))
    assert worker_launch_warning(prepare_simple_launcher_cmd_env(one)[1]) is None  # asked for one: no warning


def test_torchrun_workers_beyond_the_devices_are_named():
    from ascend_patch.adaptors.device.launchers import worker_launch_warning

    env = {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "4",
           "ASCEND_PATCH_CPU_DEVICES": "2"}
    assert worker_launch_warning(env) == (
        "ascend_patch: the launcher started 4 processes on this node, but the cpu target presents 2 virtual "
        "device(s) (ASCEND_PATCH_CPU_DEVICES=2): torch.cuda.set_device(local_rank) fails on local ranks 2 to 3; "
        "set ASCEND_PATCH_CPU_DEVICES=4 (or unset it and CUDA_VISIBLE_DEVICES) or start 2 per node")
    assert worker_launch_warning({**env, "ASCEND_PATCH_CPU_DEVICES": "4"}) is None
    assert worker_launch_warning({k: v for k, v in env.items() if k != "ASCEND_PATCH_CPU_DEVICES"}) is None


def test_accelerates_launcher_patched_sees_the_virtual_devices(patched, monkeypatch, no_accelerate_config):
    from accelerate.commands import launch

    from ascend_patch.adaptors.device import launchers

    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "ASCEND_PATCH_CPU_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(launchers, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args, _, _ = launch._validate_launch_command(_accelerate_args("--num_processes", "2"))
    assert args.multi_gpu is False  # one virtual device: accelerate's one-process launcher
    assert [str(w.message) for w in caught if "ascend_patch" in str(w.message)] == [
        "ascend_patch: accelerate launch was asked for 2 processes, but this launcher sees 1 virtual device(s) on "
        "the cpu target (the default: none of CUDA_VISIBLE_DEVICES, ASCEND_PATCH_CPU_DEVICES, an mp.spawn nprocs "
        "or LOCAL_WORLD_SIZE is set), so accelerate starts one process "
        "(world size 1). Say how many devices the node has: ASCEND_PATCH_CPU_DEVICES=2 accelerate launch ... (this "
        "launcher is patched, so that is enough), or pass --multi_gpu"]
    monkeypatch.setenv("ASCEND_PATCH_CPU_DEVICES", "2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args, _, _ = launch._validate_launch_command(_accelerate_args("--num_processes", "2"))
    assert args.multi_gpu is True and not [w for w in caught if "ascend_patch" in str(w.message)]


@pytest.mark.slow
def test_accelerate_launch_starts_as_many_workers_as_virtual_devices(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, torch, torch.distributed as dist\n"
                      "from accelerate import Accelerator\n"
                      "acc = Accelerator()\n"
                      "t = torch.ones(1, device=acc.device) * (acc.process_index + 1)\n"
                      "total = acc.reduce(t, 'sum').item()\n"
                      "print(f'WORKER {acc.process_index} of {acc.num_processes} cuda={torch.cuda.device_count()} "
                      "sum={total}', flush=True)\n")
    exe = os.path.join(os.path.dirname(sys.executable), "accelerate")
    done = subprocess.run([exe, "launch", "--num_processes", "2", "-m", "ascend_patch", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env=child_env(ASCEND_PATCH_AUTOLOAD="1", ASCEND_PATCH_CPU_DEVICES="2",
                                        ASCEND_PATCH_DEVICE="cpu", HF_HOME=str(tmp_path / "hf")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # the two workers share the launcher's stdout: one's line can land inside the other's
    lines = sorted(re.findall(r"WORKER \d+ of \d+ cuda=\d+ sum=[\d.]+", done.stdout))
    assert lines == ["WORKER 0 of 2 cuda=2 sum=3.0", "WORKER 1 of 2 cuda=2 sum=3.0"], done.stdout
