"""ASCEND_PATCH_AUTOLOAD through the .pth file: a bad value stops the process once, never runs it unpatched."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys

import pytest

from helpers import REPO, child_env

PROGRAM = "import torch; print('ran', torch.cuda.is_available())"


def start(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter whose site directory holds this checkout's .pth file (whatever pip installed)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(os.path.join(REPO, "ascend_patch_autoload.pth"), site_dir)
    code = f"import site; site.addsitedir({str(site_dir)!r}); " + PROGRAM
    env.setdefault("ASCEND_PATCH_DEVICE", "cpu")
    full = child_env(**env)
    # -S: no installed .pth file runs; the installed packages are reached through PYTHONPATH
    full["PYTHONPATH"] = os.pathsep.join([full["PYTHONPATH"], *site.getsitepackages()])
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=full, timeout=300)


def test_autoload_patches_the_process(tmp_path):
    done = start(tmp_path, ASCEND_PATCH_AUTOLOAD="1", ASCEND_PATCH_CUDA_IS_AVAILABLE="1")
    assert (done.returncode, done.stdout.strip()) == (0, "ran True"), done.stderr


@pytest.mark.parametrize("env, bad", [
    ({"ASCEND_PATCH_AUTOLOAD": "1", "ASCEND_PATCH_STRICT": "yes"}, "ASCEND_PATCH_STRICT='yes' is not allowed"),
    ({"ASCEND_PATCH_AUTOLOAD": "1", "ASCEND_PATCH_DEVCE": "cpu"}, "unknown variable ASCEND_PATCH_DEVCE; did you mean"),
    # read as every boolean variable is: 1 or 0, so "yes" is refused, not ignored
    ({"ASCEND_PATCH_AUTOLOAD": "yes"}, "ASCEND_PATCH_AUTOLOAD='yes' is not allowed; use one of: 0, 1"),
])
def test_a_bad_setting_stops_the_process_with_the_message_once(tmp_path, env, bad):
    done = start(tmp_path, **env)
    assert done.returncode == 2 and "ran" not in done.stdout, done.stdout + done.stderr
    assert done.stderr.count(bad) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "must not run unpatched" in done.stderr and "unset ASCEND_PATCH_AUTOLOAD" in done.stderr


def test_without_autoload_a_bad_setting_does_not_touch_other_programs(tmp_path):
    done = start(tmp_path, ASCEND_PATCH_AUTOLOAD="0", ASCEND_PATCH_STRICT="yes")
    assert (done.returncode, done.stdout.strip()) == (0, "ran False"), done.stderr


def test_import_in_a_program_still_raises_the_config_error(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import ascend_patch"], capture_output=True, text=True,
                          env=child_env(ASCEND_PATCH_STRICT="yes"), timeout=120)
    assert done.returncode == 1 and "ConfigError: ASCEND_PATCH_STRICT='yes' is not allowed" in done.stderr
