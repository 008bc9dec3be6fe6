"""A process whose first import is an ascend_patch module that imports torch is patched too.

The apply-on-torch-import hook then fires inside that module's own ``import torch``; applying
there needed the half-built module (a circular ImportError) — now it waits for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO, child_env

CHECK = ("import torch, sys; t = torch.empty(2, device='cuda'); "
         "print(torch.cuda.is_available(), t.device.type, sys.getprofile() is None)")


@pytest.mark.parametrize("first", ["ascend_patch.cpu_device", "ascend_patch.backend", "ascend_patch.ops"])
def test_a_torch_importing_submodule_as_first_import_is_patched_after_it(first):
    done = subprocess.run([sys.executable, "-c", f"import {first}; " + CHECK], capture_output=True, text=True,
                          env=child_env(ASCEND_PATCH_DEVICE="cpu"), timeout=300)
    # the patch applied (cuda tensors land on the host) and the watcher that waited is gone
    assert (done.returncode, done.stdout.strip()) == (0, "True cpu True"), done.stderr[-2000:]


def test_the_patch_table_tool_runs_with_the_patch_enabled(tmp_path):
    # docs/megatron.md's own regeneration command, run as documented (the patch not disabled)
    doc = tmp_path / "megatron.md"
    original = open(os.path.join(REPO, "docs", "megatron.md"), encoding="utf-8").read()
    doc.write_text(original, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "ascend_patch.adaptors.megatron.patch_table", "--update", str(doc)],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert doc.read_text(encoding="utf-8") == original  # the committed table is what the registry says
