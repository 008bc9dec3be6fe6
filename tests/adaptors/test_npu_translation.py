"""The npu target's translation, checked with a test-double device module (no torch_npu here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import REPO, child_env

_SCRIPT = textwrap.dedent("""
    import os, sys, json
    import torch
    torch.utils.rename_privateuse1_backend("npu")
    sys.path.insert(0, os.path.join({repo!r}, "tests", "adaptors"))
    from npu_double import FakeNpuModule
    import ascend_patch
    from ascend_patch.backend import Backend, UnsupportedOnTarget
    from ascend_patch.config import Settings
    from ascend_patch.devices import DeviceMap
    from ascend_patch.comm.backend_names import _group_wrapper, _ddp_init
    from ascend_patch.adaptors.device.factories import device_kwarg_wrapper

    fake = FakeNpuModule()
    npu = Backend("npu", "npu", "hccl", fake, keeps_index=True, reason="test double")
    os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
    os.environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    out = {{}}
    ascend_patch.apply(Settings(device="npu"), backend=npu)
    dmap = DeviceMap(npu)
    out["map"] = [str(dmap(d)) for d in ("cuda", "cuda:1", torch.device("cuda", 5), 3, "cpu", "/x/cuda")]
    torch.cuda.set_device(1)
    out["current"] = torch.cuda.current_device()
    out["count"] = torch.cuda.device_count()
    torch.cuda.synchronize()
    out["calls"] = [list(map(str, c)) for c in fake.calls]
    try:
        torch.cuda.mem_get_info()
    except UnsupportedOnTarget as exc:
        out["unsupported"] = str(exc)
    seen = {{}}
    def spy(*args, **kwargs):
        seen.update(kwargs)
    device_kwarg_wrapper(spy, dmap, "torch.zeros")(2, device="cuda:1")
    out["factory_device"] = str(seen["device"])
    try:
        torch.empty(2, device="cuda:1")
    except Exception as exc:
        out["empty_error"] = str(exc).splitlines()[0]
    group_seen = {{}}
    def init_pg(backend=None, init_method=None, device_id=None):
        group_seen.update(backend=backend, device_id=str(device_id))
    _group_wrapper(init_pg, npu, dmap, "init")("nccl", device_id=torch.device("cuda", 1))
    out["group"] = group_seen
    ddp_seen = {{}}
    def ddp_init(self, module, device_ids=None, output_device=None):
        ddp_seen.update(ids=[str(i) for i in device_ids], out=str(output_device))
    _ddp_init(ddp_init, npu, dmap)(object(), None, device_ids=[1], output_device=1)
    out["ddp"] = ddp_seen
    out["env"] = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    ascend_patch.remove()
    out["env_after"] = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    print(json.dumps(out))
""")


def test_npu_translation_with_a_test_double():
    script = _SCRIPT.format(repo=REPO)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=child_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["map"] == ["npu", "npu:1", "npu:5", "npu:3", "cpu", "/x/cuda"]
    assert out["current"] == 1 and out["count"] == 8
    assert out["calls"] == [["set_device", "1"], ["synchronize", "None"]]
    assert "torch.cuda.mem_get_info is not supported on the npu target" in out["unsupported"]
    assert out["factory_device"] == "npu:1"
    assert "PrivateUse1" in out["empty_error"] or "npu" in out["empty_error"]
    assert out["group"] == {"backend": "hccl", "device_id": "npu:1"}
    assert out["ddp"] == {"ids": ["npu:1"], "out": "npu:1"}
    assert out["env"] == "2,3" and out["env_after"] is None
