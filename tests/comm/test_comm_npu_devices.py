"""The npu side of device arguments to process groups, barrier and DDP, through the applied patches.

No torch_npu here: a child process renames the privateuse1 backend to "npu" (so
``torch.device("npu", 1)`` exists), applies the npu target with the test double from
tests/adaptors/npu_double.py, and puts recording stand-ins (TEST DOUBLES) in place of
torch's ``init_process_group`` / ``new_group`` / ``barrier`` / ``DistributedDataParallel.__init__``
*before* applying, so the patches wrap them and what reaches torch is recorded. On the
cpu target the same arguments are dropped (tests/comm/test_comm_backend_names.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from helpers import REPO, child_env

_SCRIPT = textwrap.dedent("""
    import functools, inspect, json, os, sys
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    torch.utils.rename_privateuse1_backend("npu")
    sys.path.insert(0, os.path.join({repo!r}, "tests", "adaptors"))
    from npu_double import FakeNpuModule
    import ascend_patch
    from ascend_patch.backend import Backend
    from ascend_patch.config import Settings

    seen = []

    # what each stand-in runs after recording: the same call on a one-rank gloo world (no NPU here)
    ON_HOST = {{
        "init_process_group": lambda fn, a: fn("gloo", store=dist.HashStore(), rank=0, world_size=1),
        "new_group": lambda fn, a: fn(a["ranks"], backend="gloo"),
        # torch's barrier asks the accelerator for a device, which a renamed privateuse1 backend
        # without torch_npu cannot answer: an all_reduce stands in for it
        "barrier": lambda fn, a: dist.all_reduce(torch.zeros(1)),
        "DistributedDataParallel": lambda fn, a: fn(a["self"], a["module"]),
    }}

    def recording(name, original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def stand_in(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            seen.append([name, {{k: str(v) for k, v in bound.items() if k in WATCHED}}])
            return ON_HOST[name](original, bound)
        return stand_in

    WATCHED = {{"backend", "device_id", "device_ids", "output_device"}}
    originals = {{name: getattr(c10d, name) for name in ("init_process_group", "new_group", "barrier")}}
    ddp_init = DistributedDataParallel.__init__
    for name, fn in originals.items():
        setattr(c10d, name, recording(name, fn))
        setattr(dist, name, getattr(c10d, name))
    DistributedDataParallel.__init__ = recording("DistributedDataParallel", ddp_init)
    stand_ins = {{name: getattr(c10d, name) for name in originals}}
    try:
        npu = Backend("npu", "npu", "hccl", FakeNpuModule(), keeps_index=True, reason="test double")
        ascend_patch.apply(Settings(device="npu"), backend=npu)
        try:
            wrapped = all(getattr(c10d, n) is not stand_ins[n] for n in originals)
            dist.init_process_group("nccl", device_id=torch.device("cuda", 1))
            dist.destroy_process_group()
            dist.init_process_group("nccl", device_id=3)
            group = dist.new_group([0], backend="nccl", device_id=torch.device("cuda", 2))
            names = [dist.get_backend(), dist.get_backend(group)]
            dist.barrier(device_ids=[1])
            dist.barrier(None, False, [2])
            dist.barrier()
            model = torch.nn.Linear(2, 2)
            DistributedDataParallel(model, device_ids=[1], output_device=1)
            DistributedDataParallel(model, device_ids=[torch.device("cuda", 2)], output_device="cuda:2")
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            ascend_patch.remove()
        restored = all(getattr(c10d, n) is stand_ins[n] for n in originals)
    finally:
        for name, fn in originals.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        DistributedDataParallel.__init__ = ddp_init
    print(json.dumps({{"seen": seen, "wrapped": wrapped, "restored": restored, "names": names}}))
""")


def test_device_arguments_reach_torch_as_npu_devices():
    done = subprocess.run([sys.executable, "-c", _SCRIPT.format(repo=REPO)], capture_output=True, text=True,
                          env=child_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["wrapped"] and out["restored"]
    assert out["names"] == ["nccl", "nccl"]  # program code still sees the backend it asked for
    assert out["seen"] == [
        ["init_process_group", {"backend": "hccl", "device_id": "npu:1"}],
        ["init_process_group", {"backend": "hccl", "device_id": "npu:3"}],
        ["new_group", {"backend": "hccl", "device_id": "npu:2"}],
        ["barrier", {"device_ids": "[1]"}],  # barrier takes indices: kept as they are on npu
        ["barrier", {"device_ids": "[2]"}],
        ["barrier", {}],
        ["DistributedDataParallel", {"device_ids": "[device(type='npu', index=1)]", "output_device": "npu:1"}],
        ["DistributedDataParallel", {"device_ids": "[device(type='npu', index=2)]", "output_device": "npu:2"}],
    ]
