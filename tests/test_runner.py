"""Running unmodified CUDA programs: python -m ascend_patch, ascend-patch run, one-line import."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, child_env

MNIST = os.path.join(REPO, "examples", "mnist_cnn.py")
SMALL = ["--train-size", "512", "--epochs", "2", "--log-interval", "1000"]


def _run(args, tmp_path, **env):
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=child_env(**env), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _epoch_losses(stdout):
    match = re.search(r"epoch losses: ([\d. ]+)", stdout)
    assert match, stdout
    return [float(x) for x in match.group(1).split()]


def _accuracy(stdout):
    return float(re.search(r"reloaded checkpoint .*accuracy ([\d.]+)", stdout).group(1))


@pytest.mark.slow
def test_mnist_through_python_m(tmp_path):
    done = _run([sys.executable, "-m", "ascend_patch", "--report", MNIST, *SMALL,
                 "--save-model", str(tmp_path / "cuda_model.pt")], tmp_path)
    first, second = _epoch_losses(done.stdout)
    assert second < first
    assert _accuracy(done.stdout) > 0.5  # the checkpoint reloaded with map_location='cuda' works
    assert (tmp_path / "cuda_model.pt").exists()
    # the migration report at exit names the CUDA APIs the script used, with their call sites
    assert "torch.Tensor.to(cuda)" in done.stderr and "mnist_cnn.py:" in done.stderr
    assert "torch.load" in done.stderr and "torch.cuda.is_available" in done.stderr


@pytest.mark.slow
def test_mnist_with_a_one_line_import(tmp_path):
    script = tmp_path / "mnist_patched.py"
    script.write_text("import ascend_patch\n" + open(MNIST).read())
    done = _run([sys.executable, str(script), *SMALL, "--save-model", str(tmp_path / "m.pt")], tmp_path)
    first, second = _epoch_losses(done.stdout)
    assert second < first


def test_module_form_and_argument_passthrough(tmp_path):
    pkg = tmp_path / "ap_prog"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(
        "import sys, torch\n"
        "print('argv', sys.argv[1:])\n"
        "print('device', torch.ones(1, device='cuda').device, torch.cuda.is_available())\n")
    done = _run([sys.executable, "-m", "ascend_patch", "--device", "cpu", "-m", "ap_prog.main",
                 "--device", "x", "-m", "y"], tmp_path, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    assert "argv ['--device', 'x', '-m', 'y']" in done.stdout
    assert "device cpu True" in done.stdout


def test_command_string_form_as_python_c(tmp_path):
    code = ("import sys, torch; print('argv', sys.argv, repr(sys.path[0]), __name__); "
            "print('device', torch.ones(1, device='cuda').device)")
    done = _run([sys.executable, "-m", "ascend_patch", "--device", "cpu", "-c", code, "a", "-m", "b"], tmp_path)
    assert "argv ['-c', 'a', '-m', 'b'] '' __main__" in done.stdout  # what python -c sets
    assert "device cpu" in done.stdout
    failed = subprocess.run([sys.executable, "-m", "ascend_patch", "-c", "import sys; sys.exit(3)"],
                            capture_output=True, text=True, cwd=tmp_path, env=child_env(), timeout=600)
    assert failed.returncode == 3


def test_ascend_patch_run_console_command(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys, torch\nprint(sys.argv[1:], torch.zeros(1, device='cuda:0').device)\n")
    exe = os.path.join(os.path.dirname(sys.executable), "ascend-patch")
    command = [exe] if os.path.exists(exe) else [sys.executable, "-m", "ascend_patch.cli"]
    done = _run([*command, "run", str(script), "--report", "a"], tmp_path)
    assert "['--report', 'a'] cpu" in done.stdout


def test_disabled_by_environment(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import ascend_patch, torch\nprint(torch.cuda.is_available())\n")
    done = _run([sys.executable, str(script)], tmp_path, ASCEND_PATCH="0")
    assert done.stdout.strip() == "False"


def test_bad_environment_value_is_a_clear_error(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import ascend_patch"], capture_output=True, text=True,
                          env=child_env(ASCEND_PATCH_DEVICE="gpu"), timeout=120)
    assert done.returncode != 0
    assert "ASCEND_PATCH_DEVICE='gpu' is not allowed; use one of: auto, npu, cpu" in done.stderr


def test_import_ascend_patch_does_not_import_torch_or_megatron(tmp_path):
    code = ("import sys, ascend_patch\n"
            "print('torch' in sys.modules)\n"
            "import torch\n"
            "print(ascend_patch.active_backend().name, 'megatron' in sys.modules, 'transformers' in sys.modules)\n")
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.stdout.split() == ["False", "cpu", "False", "False"]


def test_autoload_switch_patches_any_python_process(tmp_path):
    """ASCEND_PATCH_AUTOLOAD=1 is honoured by the .pth file an install puts in site-packages."""
    import site

    pth = [p for d in site.getsitepackages() for p in [os.path.join(d, "ascend_patch_autoload.pth")]
           if os.path.exists(p)]
    if not pth:
        pytest.skip("ascend_patch is not installed into this interpreter (no .pth file)")
    code = "import torch; print(torch.cuda.is_available())"
    assert _run([sys.executable, "-c", code], tmp_path, ASCEND_PATCH_AUTOLOAD="1").stdout.strip() == "True"
    assert _run([sys.executable, "-c", code], tmp_path).stdout.strip() == "False"


def test_runner_maps_cuda_variables_before_torch_npu_is_imported(tmp_path):
    """python -m ascend_patch on the npu target (the torch_npu test double): the runtime variables
    are set before torch_npu is imported and before the auto probe counts devices."""
    script = tmp_path / "show_env.py"
    script.write_text(
        "import os, torch, torch_npu\n"
        "print(torch_npu.IMPORT_ENV['ASCEND_RT_VISIBLE_DEVICES'], torch.npu.visible_at_first_count,\n"
        "      os.environ.get('ASCEND_RT_VISIBLE_DEVICES'), torch.zeros(1, device='cuda:1').device)\n")
    double = os.path.join(REPO, "tests", "adaptors", "fake_torch_npu")
    env = child_env(CUDA_VISIBLE_DEVICES="2,3")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = double + os.pathsep + env["PYTHONPATH"]
    env.pop("ASCEND_PATCH", None)  # the default: enabled, auto
    done = subprocess.run([sys.executable, "-m", "ascend_patch", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["2,3", "2,3", "2,3", "npu:1"]


def test_one_line_import_maps_cuda_variables_before_torch_autoloads_torch_npu(tmp_path):
    """`import ascend_patch` before `import torch`: torch's device-backend autoload imports torch_npu
    inside `import torch`, before any post-import hook runs; the variables must already be set."""
    dist = tmp_path / "site" / "fake_torch_npu-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-torch-npu\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import ascend_patch\n"
        "import os, sys, torch\n"
        "torch_npu = sys.modules['torch_npu']  # autoloaded by import torch\n"
        "print(torch_npu.IMPORT_ENV['ASCEND_RT_VISIBLE_DEVICES'], os.environ.get('ASCEND_RT_VISIBLE_DEVICES'),\n"
        "      torch.zeros(1, device='cuda:1').device)\n")
    double = os.path.join(REPO, "tests", "adaptors", "fake_torch_npu")
    env = child_env(CUDA_VISIBLE_DEVICES="2,3")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([double, str(tmp_path / "site"), env["PYTHONPATH"]])
    env.pop("ASCEND_PATCH", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["2,3", "2,3", "npu:1"]


def test_one_line_import_leaves_the_environment_alone_off_npu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import ascend_patch, os, torch\n"
                      "print(torch.zeros(1, device='cuda').device, os.environ.get('ASCEND_RT_VISIBLE_DEVICES'))\n")
    env = child_env(CUDA_VISIBLE_DEVICES="2,3")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    env.pop("ASCEND_PATCH", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["cpu", "None"]  # auto chose cpu: the early copy was undone
