"""ascend-patch doctor: versions, devices, the target auto picks, and the torch_npu-without-CANN trap."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import child_env


def _doctor(tmp_path, **env):
    done = subprocess.run([sys.executable, "-m", "ascend_patch.cli", "doctor"], capture_output=True, text=True,
                          env=child_env(**env), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_doctor_on_this_machine(tmp_path):
    out = _doctor(tmp_path)
    import torch

    assert f"torch           {torch.__version__}" in out
    assert "torch_npu       not installed" in out
    assert "import torch    ok" in out
    assert "target (auto)   cpu: torch_npu is not installed; the cpu target runs everything on the host" in out
    assert "plugins         device (builtin): patches\n" in out
    assert "                models (builtin): spec gpt, spec llama, spec mixtral, spec qwen2, spec qwen3, spec qwen3_moe\n" in out
    assert "                loaders (builtin): loader hf, loader mg, loader torch_dist, saver hf, saver mg, saver torch_dist\n" in out
    assert "plugin failure" not in out
    assert out.rstrip().endswith("cpu devices     1 virtual (the default: none of CUDA_VISIBLE_DEVICES, "
                                 "ASCEND_PATCH_CPU_DEVICES, an mp.spawn nprocs or LOCAL_WORLD_SIZE is set; "
                                 "ASCEND_PATCH_CPU_DEVICES=N presents N)")


def test_doctor_names_a_plugin_that_fails_to_load(tmp_path):
    site = tmp_path / "site"
    (site / "broken_plugin").mkdir(parents=True)
    (site / "broken_plugin" / "__init__.py").write_text("raise ImportError('needs libfoo')\n")
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\nbroken = broken_plugin\n")
    out = _doctor(tmp_path, PYTHONPATH=os.pathsep.join([str(site), child_env()["PYTHONPATH"]]))
    assert ("plugin failure  plugin 'broken' (distribution broken-plugin) failed in load: "
            "ImportError: needs libfoo") in out
    assert "                models (builtin): spec gpt" in out  # the others still load


def _fake_torch_npu(root, autoload):
    """A torch_npu that fails like it does on a host without CANN (libhccl.so missing)."""
    pkg = root / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n")
    dist = root / "torch_npu-2.13.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    if autoload:  # torch loads device backends named in this group during `import torch`
        (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")


def test_torch_npu_without_cann_breaks_import_torch_and_doctor_explains(tmp_path):
    _fake_torch_npu(tmp_path, autoload=True)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}"}
    broken = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                            env=child_env(**env), timeout=300)
    assert broken.returncode != 0 and "torch_npu" in broken.stderr  # the trap is real
    out = _doctor(tmp_path, **env)
    assert "torch_npu       2.13.0" in out and "CANN            not found" in out
    assert "target (auto)   none: torch does not import" in out
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out and "npu extra is for Ascend hosts only" in out


def test_torch_npu_that_fails_to_import_falls_back_to_cpu(tmp_path):
    _fake_torch_npu(tmp_path, autoload=False)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}"}
    out = _doctor(tmp_path, **env)
    assert "import torch_npu ImportError: libhccl.so" in out
    assert "target (auto)   cpu: torch_npu did not import: ImportError: libhccl.so" in out
    assert "CANN was not found" in out
    # and ascend_patch itself picks the cpu target there, saying why
    code = "import torch, ascend_patch; print(ascend_patch.report().reason)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(**env), timeout=300)
    assert "torch_npu is installed but failed to import (ImportError: libhccl.so" in done.stdout
