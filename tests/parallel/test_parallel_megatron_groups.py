"""Layout's groups equal the groups real megatron-core builds (torchrun, patched, cpu, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ascend_patch.parallel import MEGATRON_GROUPS, Layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import free_port  # noqa: E402

from helpers import child_env  # noqa: E402

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_groups_script.py")

LAYOUTS = {
    4: [dict(name="tp2-pp2", tp=2, pp=2, cp=1, ep=1, etp=None, order="tp-cp-ep-dp-pp"),
        dict(name="tp2-cp2", tp=2, pp=1, cp=2, ep=1, etp=None, order="tp-cp-ep-dp-pp"),
        dict(name="pp2-ep2-etp1", tp=1, pp=2, cp=1, ep=2, etp=1, order="tp-cp-ep-dp-pp"),
        dict(name="tp2-pp2-pp-before-dp", tp=2, pp=2, cp=1, ep=1, etp=None, order="tp-cp-ep-pp-dp"),
        dict(name="ep4-etp1", tp=1, pp=1, cp=1, ep=4, etp=1, order="tp-cp-ep-dp-pp")],
    8: [dict(name="tp2-cp2-pp2", tp=2, pp=2, cp=2, ep=1, etp=None, order="tp-cp-ep-dp-pp"),
        dict(name="tp2-pp2-dp2-ep2", tp=2, pp=2, cp=1, ep=2, etp=None, order="tp-cp-ep-dp-pp"),
        dict(name="tp2-cp2-ep4-etp1", tp=2, pp=1, cp=2, ep=4, etp=1, order="tp-cp-ep-pp-dp")],
}


@pytest.mark.parametrize("world", [4, 8])
def test_layout_groups_equal_initialize_model_parallel(world, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
           f"--master-port={free_port()}", "-m", "ascend_patch", "--device", "cpu", SCRIPT, str(tmp_path),
           json.dumps(LAYOUTS[world])]
    proc = subprocess.run(cmd, env=child_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for spec in LAYOUTS[world]:
        layout = Layout.from_world(world, tp=spec["tp"], pp=spec["pp"], cp=spec["cp"], ep=spec["ep"],
                                           expert_tp=spec["etp"], order=spec["order"])
        ours = layout.megatron_groups()
        for rank in range(world):
            built = per_rank[rank][spec["name"]]
            for name, groups in ours.items():
                mine = next((g for g in groups if rank in g), None)
                assert built[name] == mine, (spec["name"], rank, name, built[name], mine)
            coords, expert = layout.coordinates(rank), layout.coordinates(rank, "expert")
            assert built["_coords"] == {"tp": coords["tp"], "pp": coords["pp"], "dp": coords["dp"],
                                        "cp": coords["cp"], "ep": expert["ep"], "expert_dp": expert["dp"]}
            # megatron's groups inherit the 'nccl' default group: program code is told nccl; gloo groups stay gloo
            assert built["_backend_names"] == ["nccl", "gloo"]
            tp_group = layout.group_of(rank, "tp")
            assert built["_tp_sum"] == float(sum(tp_group))
    assert set(MEGATRON_GROUPS) < set(ours)
