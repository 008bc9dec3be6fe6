"""mp.spawn(nprocs=2) with set_device(rank) and a from-imported init_process_group (issue 13 items 3, 4, 7)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, child_env, free_port

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(REPO, "tests", "integration", "spawn_from_import.py")


def run(tmp_path, command: list[str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "rank"
    done = subprocess.run([*command, str(free_port()), str(out)], capture_output=True, text=True, cwd=tmp_path,
                          env=child_env(ASCEND_PATCH_DEVICE="cpu"), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done, [json.loads((tmp_path / f"rank.{r}").read_text()) for r in range(2)]


def check_workers(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["current"] == rank  # set_device(rank) on its own virtual device
        assert r["count"] == r["accelerator_count"] == r["at_import"] == 2  # nprocs is the local world
        assert r["sum"] == 3.0 and r["device"] == "cpu"  # the all_reduce over gloo really ran


def test_under_python_m_ascend_patch_with_a_report_per_process(tmp_path):
    done, results = run(tmp_path, [sys.executable, "-m", "ascend_patch", "--report", "all", SCRIPT])
    check_workers(results)
    assert "parent count 1" in done.stdout  # the parent's own count is unchanged
    headers = re.findall(r"=== ascend_patch migration report \((.*?), pid \d+\) ===", done.stderr)
    assert sorted(headers) == ["mp.spawn process 0 of 2", "mp.spawn process 1 of 2", "rank 0, mp.spawn parent"]


def test_with_import_ascend_patch_on_the_first_line(tmp_path):
    script = tmp_path / "first_line.py"
    script.write_text("import ascend_patch\n" + open(SCRIPT).read())
    _, results = run(tmp_path, [sys.executable, str(script)])
    check_workers(results)
