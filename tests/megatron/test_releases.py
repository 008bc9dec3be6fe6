"""Which megatron-core a process imports, the gate that reads it, and the one warning out of range."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ascend_patch.adaptors.megatron import releases
from ascend_patch.adaptors.megatron.detect import find_megatron, read_package_info
from helpers import child_env


def _tree(root, version: str, pre: str = "''") -> str:
    """A megatron/core that is only a package_info.py, as the releases write it (megatron/ a namespace)."""
    major, minor, patch = version.split(".")
    core = root / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("from megatron.core.package_info import __version__\n")
    (core / "package_info.py").write_text(
        f"# a copyright line\n\nMAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = {pre}\n\n"
        "VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)\n"
        "__version__ = '.'.join(map(str, VERSION[:3])) + ''.join(VERSION[3:])\n")
    return str(root)


def _run(code: str, tree: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=child_env(PYTHONPATH=tree + ":" + child_env()["PYTHONPATH"], ASCEND_PATCH_DEVICE="cpu",
                                        **env))


_SEEN = ("import ascend_patch, torch\n"
         "from ascend_patch.patching.versions import package_version\n"
         "from ascend_patch.adaptors.megatron.detect import find_megatron\n"
         "print('FOUND', find_megatron().describe())\n"
         "print('GATE', package_version('megatron-core').version)\n")


def test_a_checkout_shadowing_the_wheel_is_the_release_seen(tmp_path):
    done = _run(_SEEN + "import megatron.core; print('IMPORTED', megatron.core.__version__)", _tree(tmp_path, "0.17.1"))
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["GATE"] == "0.17.1" == lines["IMPORTED"]
    assert lines["FOUND"] == (f"megatron-core 0.17.1 (checkout {tmp_path}/megatron/core, shadows the installed wheel "
                              f"{__import__('importlib.metadata').metadata.version('megatron-core')})")
    assert "outside the releases" not in done.stderr


def test_a_checkout_without_any_wheel_is_detected(tmp_path):
    code = ("import importlib.metadata\n"
            "def missing(name):\n    raise importlib.metadata.PackageNotFoundError(name)\n"
            "importlib.metadata.distribution = missing  # as where no megatron-core wheel is installed\n" + _SEEN)
    done = _run(code, _tree(tmp_path, "0.12.1"))
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["FOUND"] == f"megatron-core 0.12.1 (checkout {tmp_path}/megatron/core)" and lines["GATE"] == "0.12.1"


def test_the_installed_wheel_is_seen_as_the_wheel():
    found = find_megatron()
    assert found.kind == "wheel" and found.version == found.wheel and found.path.endswith("site-packages/megatron/core")


@pytest.mark.parametrize("version,pre,expected", [("0.20.0", "''", "0.20.0"), ("0.13.1", '""', "0.13.1"),
                                                  ("0.18.0", "'rc1'", "0.18.0rc1")])
def test_package_info_is_read_without_running_it(tmp_path, version, pre, expected):
    root = _tree(tmp_path, version, pre)
    info = tmp_path / "megatron" / "core" / "package_info.py"
    info.write_text(info.read_text() + "raise SystemExit('package_info was run')\n")  # main runs git here
    assert read_package_info(str(info)) == expected
    assert root


def test_out_of_range_warns_once_at_import_and_applies_best_effort(tmp_path):
    code = (_SEEN + "import warnings\nwarnings.simplefilter('always')\nimport megatron.core\n"
            "ascend_patch.remove(); ascend_patch.apply()\nprint('STILL', ascend_patch.active_backend().name)\n")
    done = _run(code, _tree(tmp_path, "0.18.0"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("outside the releases ascend_patch supports") == 1, done.stderr
    assert (f"megatron-core 0.18.0 (checkout {tmp_path}/megatron/core, shadows the installed wheel" in done.stderr
            and "megatron-core 0.12.x to 0.17.x, and Megatron-LM main as tested at d98e8a6" in done.stderr
            and "on a best-effort basis" in done.stderr), done.stderr
    assert "to move up" not in done.stderr  # newer than the range: converting down is no advice
    assert "STILL cpu" in done.stdout


def test_strict_mode_refuses_an_out_of_range_release_when_it_is_imported(tmp_path):
    done = _run("import ascend_patch, torch\nprint('APPLIED')\nimport megatron.core\nprint('NOT REACHED')",
                _tree(tmp_path, "0.11.0"), ASCEND_PATCH_STRICT="1")
    assert done.returncode == 1 and "APPLIED" in done.stdout and "NOT REACHED" not in done.stdout
    assert "UnsupportedMegatron: megatron-core 0.11.0 (checkout" in done.stderr
    assert "ASCEND_PATCH_STRICT=1 refuses it" in done.stderr
    # older than the range: the message says how to move up
    assert "to move up, convert its checkpoints with ascend-patch convert" in done.stderr


def test_an_older_release_that_cannot_import_here_is_named_before_its_traceback(tmp_path):
    # as core_r0.8.0 does where setuptools no longer ships pkg_resources
    tree = _tree(tmp_path, "0.8.0")
    (tmp_path / "megatron" / "core" / "__init__.py").write_text("from pkg_resources import packaging\n")
    done = _run("import ascend_patch, torch\nimport megatron.core", tree)
    assert done.returncode == 1 and "No module named 'pkg_resources'" in done.stderr
    warned = done.stderr.index("megatron-core 0.8.0 (checkout")
    assert warned < done.stderr.index("Traceback"), done.stderr
    assert "to move up, convert its checkpoints with ascend-patch convert" in done.stderr
    assert done.stderr.count("outside the releases ascend_patch supports") == 1


@pytest.mark.parametrize("version, older", [("0.8.0", True), ("0.11.9", True), ("0.12.0", False), ("0.18.0", False),
                                            ("0.20.0", False)])
def test_older_releases_are_told_apart_from_newer_ones(version, older):
    from ascend_patch.adaptors.megatron import releases

    assert releases.older(version) is older


@pytest.mark.parametrize("version,ok", [("0.12.0", True), ("0.12.1", True), ("0.17.9", True), ("0.20.0", True),
                                        ("0.20.0+d98e8a6", True), ("0.11.9", False), ("0.8.0", False),
                                        ("0.18.0", False), ("0.19.2", False), ("0.20.1", False)])
def test_the_supported_releases(version, ok):
    assert releases.supported(version) is ok


def test_main_and_supported_releases_need_no_warning(tmp_path):
    done = _run(_SEEN + "import megatron.core", _tree(tmp_path, "0.20.0"))
    assert done.returncode == 0 and "outside the releases" not in done.stderr, done.stderr


def test_facts_follow_the_release_the_process_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(releases, "current_version", lambda: "0.12.1")
    assert not releases.has("tp_group_arguments") and releases.has("write_item_without_format")
    assert releases.has("legacy_grouped_mlp") and releases.has("numpy_product")
    monkeypatch.setattr(releases, "current_version", lambda: "0.20.0+d98e8a6")
    assert releases.has("tp_group_arguments") and not releases.has("legacy_grouped_mlp")
    assert not releases.has("write_item_without_format") and not releases.has("numpy_product")


def test_doctor_and_the_report_say_which_release_from_where(tmp_path):
    tree = _tree(tmp_path, "0.17.1")
    done = _run("import sys\nfrom ascend_patch.doctor import _megatron\nprint('DOCTOR', _megatron())\n"
                "import ascend_patch, torch, megatron.core\nfrom ascend_patch.patching.versions import package_version\n"
                "package_version('megatron-core')\nprint(ascend_patch.report().summary())", tree)
    assert done.returncode == 0, done.stderr
    where = f"checkout {tmp_path}/megatron/core, shadows the installed wheel"
    assert f"DOCTOR 0.17.1 ({where}" in done.stdout and done.stdout.split("\n")[0].endswith(": supported")
    assert f"checked against:\n  megatron-core 0.17.1 ({where}" in done.stdout
    old = _run("from ascend_patch.doctor import _megatron\nprint(_megatron())", _tree(tmp_path / "old", "0.8.0"))
    assert old.stdout.strip().endswith("outside the supported releases (megatron-core 0.12.x to 0.17.x, and Megatron-LM "
                                       "main as tested at d98e8a6, which reports 0.20.0): patched on a best-effort basis")
