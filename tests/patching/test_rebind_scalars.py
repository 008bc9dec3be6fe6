"""The manager never treats shared scalar values (None, True, 0) as copies of a patched attribute."""

from __future__ import annotations

import sys
import types

from ascend_patch.patch import Replace


def _plugin(patches):
    from ascend_patch.hookspec import hookimpl

    class Plugin:
        @hookimpl
        def ascend_patch_register_patches(self):
            return patches

    return Plugin()


def test_replacing_none_and_false_leaves_other_modules_alone(cpu_settings):
    import ascend_patch
    from ascend_patch.plugins import get_plugin_manager

    target = types.ModuleType("ap_test_scalar_target")
    target.maybe_fn = None
    target.flag = False
    bystander = types.ModuleType("ap_test_scalar_bystander")
    bystander.other_none = None
    bystander.other_flag = False
    sys.modules[target.__name__] = target
    sys.modules[bystander.__name__] = bystander

    def replacement():
        return "replaced"

    pm = get_plugin_manager()
    pm.register(_plugin([
        Replace(f"{target.__name__}:maybe_fn", "test", replacement=replacement),
        Replace(f"{target.__name__}:flag", "test", make=lambda original: True),
    ]), "ap_test_scalars")
    try:
        ascend_patch.apply(cpu_settings)
        assert target.maybe_fn is replacement and target.flag is True
        assert bystander.other_none is None and bystander.other_flag is False
        ascend_patch.remove()
        assert target.maybe_fn is None and target.flag is False
        assert bystander.other_none is None and bystander.other_flag is False
    finally:
        ascend_patch.remove()
        pm.unregister("ap_test_scalars")
        del sys.modules[target.__name__], sys.modules[bystander.__name__]


def test_rebind_false_keeps_shared_callable_everywhere_else(cpu_settings):
    import ascend_patch
    from ascend_patch.plugins import get_plugin_manager

    shared = types.ModuleType("ap_test_shared")

    def shared_fn():
        return "shared"

    shared.fn = shared_fn
    holder = types.ModuleType("ap_test_holder")
    holder.decorator = shared_fn  # like megatron.core.jit.jit_fuser = torch.compile
    sys.modules[shared.__name__] = shared
    sys.modules[holder.__name__] = holder
    pm = get_plugin_manager()
    pm.register(_plugin([Replace(f"{holder.__name__}:decorator", "test",
                                 replacement=lambda: "eager", rebind=False)]), "ap_test_rebind")
    try:
        ascend_patch.apply(cpu_settings)
        assert holder.decorator() == "eager"
        assert shared.fn is shared_fn
    finally:
        ascend_patch.remove()
        pm.unregister("ap_test_rebind")
        del sys.modules[shared.__name__], sys.modules[holder.__name__]
    assert holder.decorator is shared_fn
