"""Plugins: built-ins and entry-point plugins register alike; broken ones are isolated; names can be blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ascend_patch.hookspec import hookimpl
from helpers import child_env

PLUGIN = '''
from ascend_patch.hookspec import hookimpl
from ascend_patch.patch import Replace
import json

@hookimpl
def ascend_patch_register_patches(backend):
    return [Replace("json:dumps", "third-party test patch",
                    replacement=lambda *a, **k: "patched-by-{name} on " + backend.name)]
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
from ascend_patch.patch import Replace

@hookimpl
def ascend_patch_register_patches():
    return [Replace("json:no_such_function", "a target that is not there", replacement=len),
            Replace("json:loads", "for an old pluggy only", replacement=len, package="pluggy", versions="<0.1")]
'''


def test_report_command_lists_patches(plugin_path):
    import re

    import pluggy

    make_dist(plugin_path, "skippy-plugin", "ap_skippy_plugin", "skippy", SKIPPY)
    done = _run("""
        import sys
        from ascend_patch.cli import main
        sys.exit(main(["report", "--device", "cpu"]))
    """, plugin_path)
    out = done.stdout  # the whole table by default, as README says: applied / deferred / skipped
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
    def states(table):
        return [re.search(r"\s(applied|deferred|skipped|failed)\s", line).group(1)
                for line in table.split("-\n", 1)[1].splitlines() if line.strip()]

    assert states(out).count("applied") == int(summary.group(1)), out

    not_applied = _run("""
        import sys
        from ascend_patch.cli import main
        sys.exit(main(["report", "--device", "cpu", "--not-applied"]))
    """, plugin_path).stdout
    rows = states(not_applied)
    assert "applied" not in rows and rows.count("skipped") == int(summary.group(3)), not_applied


# -- hook calls go through pluggy: wrappers, tracing, failure isolation --------------------

class _Specs:
    """A plugin whose model-specs hook returns ``specs`` (or raises ``error``)."""

    def __init__(self, specs=(), error=None):
        self.specs, self.error = list(specs), error

    @hookimpl
    def ascend_patch_model_specs(self):
        if self.error is not None:
            raise self.error
        return self.specs


@pytest.fixture
def bare_pm():
    from ascend_patch.plugins import PluginManager

    return PluginManager(entry_points=False, builtins=False)


def test_a_new_style_wrapper_wraps_each_plugins_call(bare_pm):
    seen = []

    class Upper:
        @hookimpl(wrapper=True)
        def ascend_patch_model_specs(self):
            results = yield
            seen.append(results)
            return [[name.upper() for name in specs] for specs in results]

    bare_pm.register(_Specs(["a1"]), "a", origin="dist-a")
    bare_pm.register(_Specs(["b1", "b2"]), "b", origin="dist-b")
    bare_pm.register(Upper(), "upper", origin="dist-upper")
    got = list(bare_pm.call_each("ascend_patch_model_specs"))
    assert got == [("b", ["B1", "B2"]), ("a", ["A1"])]  # pluggy's order: last registered first
    assert seen == [[["b1", "b2"]], [["a1"]]]  # one call per plugin, each wrapped
    assert bare_pm.failures == []


def test_an_old_style_hookwrapper_can_drop_a_plugins_result(bare_pm):
    class DropB:
        @hookimpl(hookwrapper=True)
        def ascend_patch_model_specs(self):
            outcome = yield
            outcome.force_result([specs for specs in outcome.get_result() if "b1" not in specs])

    bare_pm.register(_Specs(["a1"]), "a")
    bare_pm.register(_Specs(["b1"]), "b")
    bare_pm.register(DropB(), "drop_b")
    assert list(bare_pm.call_each("ascend_patch_model_specs")) == [("a", ["a1"])]


def test_a_tracing_monitor_sees_every_plugin_call(bare_pm):
    calls, outcomes = [], []
    bare_pm.register(_Specs(["a1"]), "a")
    bare_pm.register(_Specs(["b1"]), "b")
    undo = bare_pm.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append((name, [i.plugin_name for i in impls])),
        lambda outcome, name, impls, kwargs: outcomes.append(outcome.get_result()))
    try:
        list(bare_pm.call_each("ascend_patch_model_specs"))
    finally:
        undo()
    assert calls == [("ascend_patch_model_specs", ["b"]), ("ascend_patch_model_specs", ["a"])]
    assert outcomes == [[["b1"]], [["a1"]]]


def test_a_raising_plugin_is_recorded_and_the_others_still_run(bare_pm):
    seen = []

    class Watch:
        @hookimpl(wrapper=True)
        def ascend_patch_model_specs(self):
            try:
                results = yield
            except Exception as exc:  # a wrapper sees the plugin's exception, then lets it go on
                seen.append(repr(exc))
                raise
            seen.append(results)
            return results

    bare_pm.register(_Specs(["a1"]), "a", origin="dist-a")
    bare_pm.register(_Specs(error=RuntimeError("no specs today")), "bad", origin="bad-dist")
    bare_pm.register(_Specs(["c1"]), "c", origin="dist-c")
    bare_pm.register(Watch(), "watch", origin="dist-watch")
    assert list(bare_pm.call_each("ascend_patch_model_specs")) == [("c", ["c1"]), ("a", ["a1"])]
    assert [str(f) for f in bare_pm.failures] == [
        "plugin 'bad' (distribution bad-dist) failed in ascend_patch_model_specs: RuntimeError: no specs today"]
    assert seen == [[["c1"]], "RuntimeError('no specs today')", [["a1"]]]


def test_a_raising_wrapper_is_recorded_once_and_left_out_afterwards(bare_pm):
    calls = []

    class Broken:
        @hookimpl(wrapper=True)
        def ascend_patch_model_specs(self):
            calls.append("wrapper")
            yield
            raise ValueError("wrapper bug")

    bare_pm.register(_Specs(["a1"]), "a")
    bare_pm.register(_Specs(["b1"]), "b")
    bare_pm.register(Broken(), "broken_wrapper", origin="wrapper-dist")
    # b's call ran inside the broken wrapper (its result is lost with it); a's runs without it
    assert list(bare_pm.call_each("ascend_patch_model_specs")) == [("a", ["a1"])]
    assert calls == ["wrapper"]
    assert [(f.plugin, f.distribution, f.error) for f in bare_pm.failures] == [
        ("broken_wrapper", "wrapper-dist", "ValueError: wrapper bug")]


def test_a_wrapper_plugin_no_longer_breaks_the_spec_registry():
    """A pass-through wrapper used to be called as a plain function: its generator's None became a spec."""
    from ascend_patch import plugins
    from ascend_patch.models.registry import get_spec_registry

    class PassThrough:
        @hookimpl(wrapper=True)
        def ascend_patch_model_specs(self):
            return (yield)

    pm = plugins.PluginManager(entry_points=False)
    pm.register(PassThrough(), "pass_through")
    previous = plugins.reset_plugin_manager(pm)
    try:
        registry = get_spec_registry(refresh=True)
        assert registry.get("qwen3").owner == "models" and pm.failures == []
    finally:
        plugins.reset_plugin_manager(previous)
        get_spec_registry(refresh=True)
