"""The patch manager on synthetic targets: apply, remove by identity, defer, re-bind, isolate, conflict."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import textwrap
import types

import pytest

import ascend_patch
from ascend_patch import plugins
from ascend_patch.patching.manager import PatchConflict, PatchError, manager
from ascend_patch.backend import cpu_backend
from ascend_patch.config import Settings
from ascend_patch.hookspec import hookimpl
from ascend_patch.patch import Action, Add, EnvVar, ModuleShim, Replace, Wrap


class _Plugin:
    def __init__(self, patches):
        self.patches = patches

    @hookimpl
    def ascend_patch_register_patches(self):
        return self.patches


@pytest.fixture
def isolated(monkeypatch):
    """A plugin manager without built-ins; returns a function that registers test plugins."""
    pm = plugins.PluginManager(entry_points=False, builtins=False)
    previous = plugins.reset_plugin_manager(pm)

    def add(name, *patches):
        pm.register(_Plugin(list(patches)), name, origin="test")

    try:
        yield add
    finally:
        ascend_patch.remove()
        plugins.reset_plugin_manager(previous)


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


@pytest.fixture
def target():
    def original(x):
        return ("original", x)

    class Thing:
        def method(self):
            return "method"

    mod = _module("ap_target", f=original, Thing=Thing, value=1)
    yield mod
    for name in [n for n in sys.modules if n.startswith("ap_")]:
        del sys.modules[name]


def apply_cpu(**changes):
    return ascend_patch.apply(Settings(device="cpu", **changes), backend=cpu_backend())


def test_replace_and_remove_by_identity(isolated, target):
    original = target.f
    isolated("t", Replace("ap_target:f", "test", replacement=lambda x: ("new", x)))
    report = apply_cpu()
    assert target.f(1) == ("new", 1)
    assert report.rows("applied")[0].patch.owner == "t"
    ascend_patch.remove()
    assert target.f is original


def test_make_receives_the_original(isolated, target):
    isolated("t", Replace("ap_target:f", "test", make=lambda orig: lambda x: ("wrapped",) + orig(x)))
    apply_cpu()
    assert target.f(2) == ("wrapped", "original", 2)


def test_class_attribute_inherited_is_deleted_on_remove(isolated, target):
    class Child(target.Thing):
        pass

    target.Child = Child
    isolated("t", Replace("ap_target:Child.method", "test", replacement=lambda self: "patched"))
    apply_cpu()
    assert Child().method() == "patched" and "method" in vars(Child)
    ascend_patch.remove()
    assert "method" not in vars(Child)
    assert Child().method() == "method"


def test_wrap_uses_wrapt_signature(isolated, target):
    seen = []

    def wrapper(wrapped, instance, args, kwargs):
        seen.append(args)
        return ("via wrapper",) + wrapped(*args, **kwargs)

    isolated("t", Wrap("ap_target:f", "test", wrapper=wrapper))
    apply_cpu()
    assert target.f(3) == ("via wrapper", "original", 3)
    assert seen == [(3,)]


def test_second_apply_never_double_wraps(isolated, target):
    calls = []
    isolated("t", Replace("ap_target:f", "test",
                          make=lambda orig: lambda x: calls.append(x) or orig(x)))
    apply_cpu()
    first = target.f
    ascend_patch.apply()
    ascend_patch.apply(Settings(device="cpu"))
    assert target.f is first
    target.f(1)
    assert calls == [1]


def test_rebinds_copies_made_before_and_restores_them(isolated, target):
    original = target.f
    user = _module("ap_user", f=target.f, alias=target.f)
    isolated("t", Replace("ap_target:f", "test", replacement=lambda x: "new"))
    report = apply_cpu()
    assert user.f(0) == "new" and user.alias(0) == "new"
    status = report.rows("applied")[0]
    assert sorted(status.rebound) == ["ap_user.alias", "ap_user.f"]
    ascend_patch.remove()
    assert user.f is original and user.alias is original


def test_copy_made_while_patched_is_restored(isolated, target):
    original = target.f
    isolated("t", Replace("ap_target:f", "test", replacement=lambda x: "new"))
    apply_cpu()
    late = _module("ap_late", f=target.f)  # `from ap_target import f` while patched
    ascend_patch.remove()
    assert late.f is original


def test_copy_of_a_shared_replacement_made_while_patched_is_restored_by_name(isolated, target):
    """rebind=False (the original is shared, like megatron's jit_fuser = torch.compile): a module imported
    while patched copies the replacement under the attribute's name; remove() puts the original there, and
    leaves the same object held under another name alone (not a copy of this attribute)."""
    original = target.f
    shared = _module("ap_shared", eager=lambda x: "new").eager
    isolated("t", Replace("ap_target:f", "test", replacement=shared, rebind=False))
    apply_cpu()
    late = _module("ap_late_shared", f=target.f, other=target.f)
    ascend_patch.remove()
    assert late.f is original and late.other is shared and sys.modules["ap_shared"].eager is shared


def _write_module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))


def test_deferred_until_import(isolated, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "ap_later", """
        def g():
            return "original"
    """)
    isolated("t", Replace("ap_later:g", "test", replacement=lambda: "patched"))
    report = apply_cpu()
    assert report.rows("deferred")[0].detail == "waiting for import of ap_later"
    assert "ap_later" not in sys.modules
    mod = importlib.import_module("ap_later")
    assert mod.g() == "patched"
    assert manager.status_of("ap_later:g").state == "applied"
    ascend_patch.remove()
    assert mod.g() == "original"
    del sys.modules["ap_later"]


def test_deferred_patch_never_fires_after_remove(isolated, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "ap_never", "def g():\n    return 'original'\n")
    isolated("t", Replace("ap_never:g", "test", replacement=lambda: "patched"))
    apply_cpu()
    ascend_patch.remove()
    mod = importlib.import_module("ap_never")
    assert mod.g() == "original"
    del sys.modules["ap_never"]


def test_missing_target_is_skipped_with_reason(isolated, target):
    isolated("t", Replace("ap_target:nope", "test", replacement=1),
             Replace("ap_target:f", "test", replacement=lambda x: "ok"))
    report = apply_cpu()
    skipped = report.rows("skipped")
    assert [s.patch.target for s in skipped] == ["ap_target:nope"]
    assert "target missing" in skipped[0].detail and "nope" in skipped[0].detail
    assert target.f(0) == "ok"  # the other patch still applied


def test_strict_makes_a_skip_fatal(isolated, target):
    isolated("t", Replace("ap_target:nope", "test", replacement=1))
    with pytest.raises(PatchError, match="ap_target.nope: target missing.*ASCEND_PATCH_STRICT=1"):
        apply_cpu(strict=True)


def test_version_out_of_range_is_skipped(isolated, target):
    isolated("t", Replace("ap_target:f", "test", replacement=1, package="pluggy", versions="<0.1"),
             Replace("ap_target:value", "test", replacement=2, package="not-a-real-dist-xyz",
                     versions=">=1"))
    report = apply_cpu()
    details = {s.patch.target: s.detail for s in report.rows("skipped")}
    import pluggy

    assert details["ap_target:f"] == f"pluggy {pluggy.__version__} is outside the checked range <0.1"
    assert "not-a-real-dist-xyz is not installed" in details["ap_target:value"]
    assert target.value == 1


def test_conflict_names_both_plugins(isolated, target):
    isolated("first", Replace("ap_target:f", "reason one", replacement=1))
    isolated("second", Replace("ap_target:f", "reason two", replacement=2))
    with pytest.raises(PatchConflict) as err:
        apply_cpu()
    msg = str(err.value)
    assert "'first' (reason one)" in msg and "'second' (reason two)" in msg and "ap_target:f" in msg
    assert not manager.active


def test_two_wraps_of_one_target_compose_in_plugin_order_and_unwind_by_identity(isolated, target):
    from ascend_patch.patching.attributes import _LIVE

    original = target.f
    user = _module("ap_user", f=target.f)  # a copy made before the patch

    def tag(label):
        return lambda wrapped, instance, args, kwargs: (label, wrapped(*args, **kwargs))

    isolated("inner", Wrap("ap_target:f", "first wrap", wrapper=tag("inner")))
    isolated("outer", Wrap("ap_target:f", "second wrap", wrapper=tag("outer")))
    report = apply_cpu()
    order = [s.patch.owner for s in report.statuses if s.patch.target == "ap_target:f"]
    # pluggy calls the newest plugin first, so its wrap is collected first and sits innermost
    assert order == ["outer", "inner"]
    assert [s.state for s in report.statuses] == ["applied", "applied"]
    assert target.f(3) == ("inner", ("outer", ("original", 3)))
    assert user.f is target.f  # the copy follows the outermost wrap
    assert str(report).count("ap_target.f") == 2  # both rows in the table
    ascend_patch.apply(Settings(device="cpu", report="1"))  # a re-apply with new settings starts over
    assert target.f(3) == ("inner", ("outer", ("original", 3)))
    ascend_patch.remove()
    assert target.f is original and user.f is original
    assert not any(id(v) == id(target.f) for v, _, _ in _LIVE.values())


def test_a_wrap_and_a_replace_of_one_target_conflict(isolated, target):
    isolated("first", Wrap("ap_target:f", "a wrap", wrapper=lambda w, i, a, k: w(*a, **k)))
    isolated("second", Replace("ap_target:f", "a replacement", replacement=len))
    with pytest.raises(PatchConflict, match="only wraps compose"):
        apply_cpu()


def test_an_old_style_plugin_still_adds_through_the_registry_with_a_deprecation_warning(isolated, target):
    class OldStyle:
        @hookimpl
        def ascend_patch_register_patches(self, registry, backend):
            registry.add(Replace("ap_target:f", "old style", replacement=lambda x: ("old", backend.name)))

    with pytest.warns(DeprecationWarning, match="return the patches instead"):
        plugins.get_plugin_manager().register(OldStyle(), "old", origin="test")
    report = apply_cpu()
    assert target.f(0) == ("old", "cpu") and report.rows("applied")[0].patch.owner == "old"


def test_a_hook_returning_something_else_than_patches_fails_its_plugin_only(isolated, target):
    class Junk:
        @hookimpl
        def ascend_patch_register_patches(self):
            return 42

    plugins.get_plugin_manager().register(Junk(), "junk", origin="junkdist")
    isolated("good", Replace("ap_target:f", "test", replacement=lambda x: "good"))
    with pytest.warns(UserWarning, match="plugin 'junk' \\(distribution junkdist\\).*TypeError"):
        report = apply_cpu()
    assert target.f(0) == "good" and any("junk" in f for f in report.plugin_failures)


def test_broken_plugin_does_not_stop_the_others(isolated, target):
    class Broken:
        @hookimpl
        def ascend_patch_register_patches(self):
            raise RuntimeError("boom")

    plugins.get_plugin_manager().register(Broken(), "broken", origin="brokendist")
    isolated("good", Replace("ap_target:f", "test", replacement=lambda x: "good"))
    with pytest.warns(UserWarning, match="plugin 'broken' \\(distribution brokendist\\).*boom"):
        report = apply_cpu()
    assert target.f(0) == "good"
    assert any("boom" in f for f in report.plugin_failures)


def test_strict_makes_a_plugin_failure_fatal(isolated, target):
    class Broken:
        @hookimpl
        def ascend_patch_register_patches(self):
            raise RuntimeError("boom")

    plugins.get_plugin_manager().register(Broken(), "broken", origin="brokendist")
    isolated("good", Replace("ap_target:f", "test", replacement=lambda x: "good"))
    with pytest.raises(PatchError, match="plugin 'broken' \\(distribution brokendist\\).*boom.*ASCEND_PATCH_STRICT=1"):
        apply_cpu(strict=True)
    assert not manager.active and manager.backend is None
    assert target.f(0) == ("original", 0)  # nothing was applied
    with pytest.warns(UserWarning, match="boom"):  # without strict: a warning, reported once
        report = apply_cpu()
    assert [f for f in report.plugin_failures if "boom" in f] == [
        "plugin 'broken' (distribution brokendist) failed in ascend_patch_register_patches: RuntimeError: boom"]
    assert target.f(0) == "good"


def test_backend_filter(isolated, target):
    isolated("t", Replace("ap_target:f", "npu only", replacement=1, backends=frozenset({"npu"})))
    report = apply_cpu()
    assert report.statuses == [] and callable(target.f)


def test_add_only_when_missing(isolated, target):
    isolated("t", Add("ap_target:added", "test", replacement=5),
             Add("ap_target:value", "test", replacement=7))
    apply_cpu()
    assert target.added == 5 and target.value == 1
    ascend_patch.remove()
    assert not hasattr(target, "added")


def test_env_patch_restores(isolated, monkeypatch):
    monkeypatch.setenv("AP_SOURCE", "0,1")
    monkeypatch.delenv("AP_TARGET_VAR", raising=False)
    isolated("t", EnvVar("AP_TARGET_VAR", "test",
                         make=lambda cur: cur if cur is not None else os.environ.get("AP_SOURCE")))
    apply_cpu()
    assert os.environ["AP_TARGET_VAR"] == "0,1"
    ascend_patch.remove()
    assert "AP_TARGET_VAR" not in os.environ


def test_shim_module_served_only_when_missing_and_removed(isolated, tmp_path, monkeypatch):
    from ascend_patch.shim import ShimMissing, ShimModule

    def build(name):
        mod = ShimModule(name, hints={"other": "use ap_shimmed.thing"})
        mod.thing = 42
        return mod

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ap_real").mkdir()
    (tmp_path / "ap_real" / "__init__.py").write_text("REAL = True\n")
    isolated("t", ModuleShim("ap_shimmed", "test", make=build),
             ModuleShim("ap_real", "test", make=build))
    report = apply_cpu()
    states = {s.patch.target: (s.state, s.detail) for s in report.statuses}
    assert states["ap_real"] == ("skipped", "ap_real is installed; the real package is used")
    spec = importlib.util.find_spec("ap_shimmed")
    assert "ascend_patch shim" in spec.origin
    import ap_shimmed

    assert ap_shimmed.thing == 42
    with pytest.raises(ShimMissing, match="ap_shimmed.other is not provided.*use ap_shimmed.thing"):
        ap_shimmed.other  # noqa: B018
    assert not hasattr(ap_shimmed, "also_missing")
    import ap_real

    assert ap_real.REAL is True
    ascend_patch.remove()
    assert "ap_shimmed" not in sys.modules
    assert importlib.util.find_spec("ap_shimmed") is None
    del sys.modules["ap_real"]


def test_report_counts_calls_with_first_site(isolated, target):
    isolated("t", Replace("ap_target:f", "test", replacement=lambda x: x,
                          action=Action.EMULATED, api="ap.f"))
    apply_cpu(report="1")
    target.f(1)
    line = sys._getframe().f_lineno - 1
    target.f(2)
    uses = ascend_patch.report().uses
    assert [(u.api, u.calls, u.action) for u in uses] == [("ap.f", 2, "emulated")]
    assert uses[0].first_site == f"{__file__}:{line}"


def test_patched_context_manager(isolated, target):
    original = target.f
    isolated("t", Replace("ap_target:f", "test", replacement=lambda x: "in"))
    with ascend_patch.patched(Settings(device="cpu"), backend=cpu_backend()) as report:
        assert target.f(0) == "in" and report.target == "cpu"
    assert target.f is original and not manager.active


def test_disabled_applies_nothing(isolated, target):
    original = target.f
    isolated("t", Replace("ap_target:f", "test", replacement=1))
    report = ascend_patch.apply(Settings(enabled=False))
    assert report.target is None and target.f is original


def test_plain_values_are_never_rebound(isolated, target):
    """A replaced empty tuple must not rewrite every `()` in every module (only callables are copies)."""
    target.empty = ()
    other = _module("ap_other", unrelated=())
    isolated("t", Replace("ap_target:empty", "test", replacement=(1,)))
    apply_cpu()
    assert target.empty == (1,) and other.unrelated == ()
    ascend_patch.remove()
    assert target.empty == () and other.unrelated == ()


@pytest.mark.parametrize("installed, versions", [
    ("2.13.0+cpu", ">=2.13,<2.14"), ("2.14.0", ">=2.13,<2.14"), ("0.16.1", ">=0.16, <0.17"),
    ("0.17.0rc1", ">=0.16,<0.17"), ("0.16.0rc1", ">=0.15"), ("0.16.1", "==0.16.*"), ("0.15.9", "==0.16.*"),
    ("0.16.1", ""), ("1.4", "~=1.0"), ("2.12.9", ">2.12.9"), ("3.0", "!=3.0"), ("3.0.0", "==3.0"),
])
def test_version_ranges_follow_packaging(installed, versions):
    """The fast path for plain comparisons decides exactly as packaging's SpecifierSet does."""
    from packaging.specifiers import SpecifierSet

    from ascend_patch.patching.versions import in_range

    assert in_range(installed, versions) is SpecifierSet(versions).contains(installed)


def _npu_stand_in():
    """A backend named npu over the host (nothing here reaches a device: only env patches are registered)."""
    from ascend_patch.backend import Backend

    return Backend(name="npu", device_type="cpu", dist_backend="gloo", device_module=None, reason="stand-in")


def test_import_selection_and_env_patches_share_one_environment_transaction(isolated, monkeypatch):
    from ascend_patch.adaptors.device.environment import environment_patches
    from ascend_patch.environ import carry_over_cuda_variables, process_environment

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    for name in ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_LAUNCH_BLOCKING", "PYTORCH_NPU_ALLOC_CONF",
                 "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    carry_over_cuda_variables(process_environment())  # what `import ascend_patch` does before torch
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")  # set later: the env patch carries it over
    isolated("env", *environment_patches())
    report = ascend_patch.apply(Settings(device="cpu"), backend=_npu_stand_in())
    details = {s.patch.target: (s.state, s.detail) for s in report.statuses}
    assert details["ASCEND_RT_VISIBLE_DEVICES"] == (
        "applied", "ASCEND_RT_VISIBLE_DEVICES=2,3 (set before torch_npu was imported)")
    assert details["ASCEND_LAUNCH_BLOCKING"] == ("applied", "ASCEND_LAUNCH_BLOCKING=1")
    assert details["PYTORCH_NPU_ALLOC_CONF"] == ("skipped", "nothing to set")
    assert os.environ["ASCEND_LAUNCH_BLOCKING"] == "1"
    ascend_patch.remove()
    assert "ASCEND_RT_VISIBLE_DEVICES" not in os.environ and "ASCEND_LAUNCH_BLOCKING" not in os.environ
    assert process_environment().changes == ()


def test_a_target_other_than_npu_puts_the_early_carry_over_back(isolated, monkeypatch):
    from ascend_patch.environ import carry_over_cuda_variables, process_environment

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    carry_over_cuda_variables(process_environment())
    assert os.environ["ASCEND_RT_VISIBLE_DEVICES"] == "1"
    apply_cpu()  # an explicit apply (python -m ascend_patch) on cpu, not only the import-time one
    assert "ASCEND_RT_VISIBLE_DEVICES" not in os.environ and process_environment().changes == ()


def test_each_record_type_finds_its_applier_and_an_unknown_one_fails_its_plugin(isolated, target):
    import dataclasses

    from ascend_patch.patch import Patch

    @dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
    class Tagged(Replace):  # a plugin's own record type derived from one the manager knows
        tag: str = "mine"

    @dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
    class Unknown(Patch):
        pass

    isolated("tagged", Tagged("ap_target:f", "test", replacement=lambda x: "tagged"))
    isolated("unknown", Unknown("ap_target:value", "test"))
    with pytest.warns(UserWarning, match="plugin 'unknown'.*Unknown is not a patch record type"):
        report = apply_cpu()
    assert target.f(0) == "tagged" and target.value == 1
    assert [s.patch.target for s in report.statuses] == ["ap_target:f"]


def test_a_deferred_module_is_watched_once_however_often_apply_runs(isolated, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "ap_watched", "def g():\n    return 'original'\n")
    isolated("t", Replace("ap_watched:g", "test", replacement=lambda: "patched"))
    seen = []
    monkeypatch.setattr(manager, "on_import", lambda name: seen.append(name) or type(manager).on_import(manager, name))
    for _ in range(3):
        apply_cpu()
        ascend_patch.remove()
    apply_cpu()
    mod = importlib.import_module("ap_watched")
    assert mod.g() == "patched" and seen == ["ap_watched"]  # one hook, fired once
    ascend_patch.remove()
    assert mod.g() == "original"
    del sys.modules["ap_watched"]


def test_a_missing_owner_on_the_path_is_skipped_with_getattrs_words(isolated, target):
    isolated("t", Replace("ap_target:Thing.nope.method", "test", replacement=1))
    report = apply_cpu()
    assert [(s.state, s.detail) for s in report.statuses] == [
        ("skipped", "target missing: type object 'Thing' has no attribute 'nope'")]
