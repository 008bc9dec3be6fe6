"""Plugins: built-ins and entry-point plugins register alike; broken ones are isolated; names can be blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import child_env

PLUGIN = '''
from ascend_patch.hookspec import hookimpl
from ascend_patch.patch import Patch, PatchKind
import json

@hookimpl
def ascend_patch_register_patches(registry, backend):
    registry.add(Patch("json:dumps", PatchKind.REPLACE, "third-party test patch",
                       replacement=lambda *a, **k: "patched-by-{name} on " + backend.name))
'''


def make_dist(root, dist, module, entry, body):
    (root / f"{module}.py").write_text(body)
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{entry} = {module}\n")


@pytest.fixture
def plugin_path(tmp_path):
    make_dist(tmp_path, "good-plugin", "ap_good_plugin", "good", PLUGIN.format(name="good"))
    make_dist(tmp_path, "broken-plugin", "ap_broken_plugin", "broken", "raise ImportError('needs libfoo')\n")
    return tmp_path


def _run(code, plugin_path, **env):
    pythonpath = f"{plugin_path}:{child_env()['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=child_env(PYTHONPATH=pythonpath, **env), timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_entry_point_plugin_is_found_and_broken_one_is_isolated(plugin_path):
    done = _run("""
        import json, warnings
        import torch, ascend_patch
        from ascend_patch.config import Settings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = ascend_patch.apply(Settings(device="cpu"))
        print(json.dumps({}))
        status = [s for s in report.statuses if s.patch.target == "json:dumps"][0]
        print("owner", status.patch.owner, status.state)
        print("failures", report.plugin_failures)
        print("warned", any("broken-plugin" in str(w.message) for w in caught))
        ascend_patch.remove()
        print("restored", json.dumps({}) == "{}")
    """, plugin_path, ASCEND_PATCH="0")
    lines = done.stdout.splitlines()
    assert lines[0] == "patched-by-good on cpu"
    assert "owner good applied" in lines[1]
    assert "plugin 'broken' (distribution broken-plugin) failed in load: ImportError: needs libfoo" in lines[2]
    assert lines[3] == "warned True" and lines[4] == "restored True"


def test_plugins_can_be_disabled_by_name(plugin_path):
    done = _run("""
        import json, torch, ascend_patch
        report = ascend_patch.apply()
        print(json.dumps({}), sorted(__import__("ascend_patch.plugins").plugins.get_plugin_manager().names()))
    """, plugin_path, ASCEND_PATCH_DEVICE="cpu", ASCEND_PATCH_DISABLE_PLUGINS="good,broken")
    out = done.stdout.strip()
    assert out.startswith("{}") and "'good'" not in out and "'device'" in out


SKIPPY = '''
from ascend_patch.hookspec import hookimpl
from ascend_patch.patch import Patch, PatchKind

@hookimpl
def ascend_patch_register_patches(registry, backend):
    registry.add(Patch("json:no_such_function", PatchKind.REPLACE, "a target that is not there", replacement=len))
    registry.add(Patch("json:loads", PatchKind.REPLACE, "for an old pluggy only", replacement=len,
                       package="pluggy", versions="<0.1"))
'''


def test_report_command_lists_patches(plugin_path):
    import re

    import pluggy

    make_dist(plugin_path, "skippy-plugin", "ap_skippy_plugin", "skippy", SKIPPY)
    done = _run("""
        import sys
        from ascend_patch.cli import main
        sys.exit(main(["report", "--device", "cpu", "--applied"]))
    """, plugin_path)
    out = done.stdout
    assert "ascend_patch: target cpu" in out

    def row(patch, state, plugin, detail):
        return re.search(rf"^{re.escape(patch)}\s+{state}\s+\S+\s+{plugin}\s+{re.escape(detail)}$", out, re.M)

    assert row("json.dumps", "applied", "good", "third-party test patch"), out
    assert row("torch.cuda.set_device", "applied", "device", "onto cpu's device module"), out
    # deferred: megatron's patches wait for megatron to be imported
    assert row("megatron.core.jit.jit_fuser (torch.compile)", "deferred", "megatron",
               "waiting for import of megatron.core.jit"), out
    # skipped, each with its reason
    assert row("json.no_such_function", "skipped", "skippy", "target missing: json has no no_such_function"), out
    assert row("json.loads", "skipped", "skippy", f"pluggy {pluggy.__version__} is outside the checked range <0.1"), out
    summary = re.search(r"patches: (\d+) applied, (\d+) deferred, (\d+) skipped", out)
    assert summary and int(summary.group(2)) >= 1 and int(summary.group(3)) >= 2, out
