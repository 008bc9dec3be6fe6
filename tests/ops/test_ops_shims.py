"""Shim modules: importable while the package is missing, truthful find_spec, clear errors, removed on remove()."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest
import torch

from ascend_patch.shim import ShimImportError, ShimMissing, is_shim

TOPS = ["apex", "amp_C", "fused_layer_norm_cuda", "flash_attn", "transformer_engine"]


@pytest.fixture
def no_real_packages():
    for top in TOPS:
        if importlib.util.find_spec(top) is not None:
            pytest.skip(f"{top} is really installed here; the shim tests need it missing")


@pytest.mark.parametrize("name", [
    "apex", "apex.optimizers", "apex.normalization", "apex.multi_tensor_apply", "apex.contrib.layer_norm.layer_norm",
    "amp_C", "fused_layer_norm_cuda", "flash_attn", "flash_attn.layers.rotary", "flash_attn.flash_attn_interface",
    "transformer_engine", "transformer_engine.pytorch.optimizers"])
def test_shims_import_and_say_what_they_are(no_real_packages, patched, name):
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin.startswith("ascend_patch shim (")
    module = importlib.import_module(name)
    assert is_shim(module) and module.__doc__.startswith(f"ascend_patch shim for {name}")


def test_remove_deletes_every_shim(no_real_packages, cpu_settings):
    import ascend_patch

    ascend_patch.apply(cpu_settings)
    try:
        import apex.optimizers  # noqa: F401
        import flash_attn.layers.rotary  # noqa: F401
        import transformer_engine.pytorch.optimizers  # noqa: F401
    finally:
        ascend_patch.remove()
    assert not [m for m in sys.modules if m.split(".")[0] in TOPS]
    assert all(importlib.util.find_spec(top) is None for top in TOPS)
    with pytest.raises(ModuleNotFoundError):
        import apex  # noqa: F401


def test_missing_apis_name_themselves_and_what_to_use(no_real_packages, patched):
    import amp_C
    import apex.optimizers
    import flash_attn

    with pytest.raises(ShimMissing, match=r"apex\.optimizers\.FusedLAMB is not provided .*torch\.optim\.AdamW"):
        apex.optimizers.FusedLAMB
    with pytest.raises(ShimImportError, match=r"flash_attn\.flash_attn_interface\._flash_attn_forward .*call "
                                              r"flash_attn_func"):
        from flash_attn.flash_attn_interface import _flash_attn_forward  # noqa: F401
    with pytest.raises(ImportError, match=r"apex\.amp is not provided .*torch\.amp"):
        from apex import amp  # noqa: F401
    assert not hasattr(amp_C, "multi_tensor_lamb") and hasattr(amp_C, "multi_tensor_l2norm")
    assert getattr(flash_attn, "bert_padding", None) is None


def test_shims_are_the_adapted_objects(no_real_packages, patched, seeded):
    import amp_C
    import apex.normalization
    import apex.optimizers
    import apex.optimizers.fused_adam
    import flash_attn
    from apex.multi_tensor_apply import multi_tensor_applier
    from flash_attn.layers.rotary import apply_rotary_emb
    from transformer_engine.pytorch.optimizers import FusedAdam as TEFusedAdam

    from ascend_patch.ops import optim

    assert apex.optimizers.FusedAdam is apex.optimizers.fused_adam.FusedAdam
    assert issubclass(apex.optimizers.FusedAdam, optim.ApexFusedAdam) and issubclass(TEFusedAdam, optim.TEFusedAdam)
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    p.grad = torch.full((4,), 0.5)
    apex.optimizers.FusedAdam([p], lr=0.1).step()
    assert torch.allclose(p, torch.full((4,), 0.9))  # first Adam step moves each weight by lr
    q = torch.randn(1, 4, 2, 8)
    torch.testing.assert_close(flash_attn.flash_attn_func(q, q, q, causal=True),
                               torch.nn.functional.scaled_dot_product_attention(
                                   q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2),
                                   is_causal=True).transpose(1, 2))
    cos, sin = torch.ones(4, 4), torch.zeros(4, 4)
    assert torch.equal(apply_rotary_emb(q, cos, sin), q)  # zero angle
    noop = torch.zeros(1, dtype=torch.int)
    norm, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm, noop, [[torch.full((4,), 3.0)]], False)
    assert norm.item() == pytest.approx(6.0) and noop.item() == 0
    from npu_references import CallLog, reference_npu_rms_norm

    from ascend_patch.backend import current_target

    log = CallLog(reference_npu_rms_norm)
    with current_target().kernels.override(npu_rms_norm=log):
        apex.normalization.FusedRMSNorm(8)(torch.randn(2, 8))
    assert len(log.calls) == 1  # the active target's kernel, read when the norm runs


def test_every_shim_module_serves_exactly_its_declaration(no_real_packages, patched):
    from ascend_patch.shim import Renamed, resolve_path

    tables = patched.shim_tables()
    assert sorted(tables) == ["amp_C", "apex", "flash_attn", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda",
                              "grouped_gemm", "transformer_engine", "triton"]
    builders = {s.patch.target: s.patch.make for s in patched.statuses if s.patch.target in tables["triton"]}
    for package, table in tables.items():
        for name, spec in table.items():
            # triton is served to megatron-core's unguarded importers only (tests/ops/test_triton_shim.py)
            mod = builders[name].module(name) if package == "triton" else importlib.import_module(name)
            assert is_shim(mod) and mod.__all__ == sorted(spec.provides), name
            assert getattr(mod, "__version__", None) == spec.version, name
            for attr, target in spec.provides.items():
                obj = getattr(mod, attr)
                if isinstance(target, Renamed):
                    assert issubclass(obj, resolve_path(target.target)) and obj is not resolve_path(target.target)
                    assert f"{obj.__module__}.{obj.__qualname__}" == f"{target.module}.{attr}", (name, attr)
                else:
                    assert obj is resolve_path(target), (name, attr)
            for child in spec.children:
                assert getattr(mod, child) is sys.modules.get(f"{name}.{child}", getattr(mod, child))


def test_report_shims_lists_each_name_and_what_it_maps_to(no_real_packages, capsys):
    from ascend_patch.cli import main

    assert main(["report", "--device", "cpu", "--shims"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["shim", "module", "name", "maps", "to", "state"]
    rows = {tuple(line.split()[:3]): " ".join(line.split()[3:]) for line in lines[2:]}
    assert rows[("apex.optimizers", "FusedAdam", "ascend_patch.ops.optim:ApexFusedAdam")] == (
        "as apex.optimizers.fused_adam.FusedAdam served on import")
    assert rows[("transformer_engine.pytorch", "RMSNorm", "ascend_patch.adaptors.megatron.te.norm:RMSNorm")]
    assert rows[("grouped_gemm.ops", "gmm", "ascend_patch.adaptors.megatron.moe:gmm")]
    assert "served on import (not to torch and 10 more)" in rows[("triton", "jit",
                                                                  "ascend_patch.adaptors.megatron.triton_shim:jit")]
    assert ("flash_attn", "__version__", "'2.8.3'") in rows


def test_a_real_package_is_never_shadowed(tmp_path, monkeypatch, cpu_settings):
    import ascend_patch
    from ascend_patch.patching.manager import manager

    real = tmp_path / "site" / "flash_attn"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    ascend_patch.apply(cpu_settings)
    try:
        import flash_attn

        assert getattr(flash_attn, "REAL", False) is True and not is_shim(flash_attn)
        status = manager.status_of("flash_attn")
        assert status.state == "skipped" and "flash_attn is installed" in status.detail
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("flash_attn.layers.rotary")  # never grafted into the real package
        listing = ascend_patch.report().shim_table().splitlines()
        assert any(line.startswith("flash_attn ") and line.endswith("real package installed") for line in listing)
        assert any(line.startswith("amp_C ") and line.endswith("served on import") for line in listing)
    finally:
        ascend_patch.remove()
        sys.modules.pop("flash_attn", None)


def _import_as(module_name: str, statement: str) -> None:
    exec(compile(statement, f"<{module_name}>", "exec"), {"__name__": module_name})


def test_a_shim_can_stay_hidden_from_some_importers(cpu_settings):
    """ModuleShim.hidden_from (transformer_engine uses it against a megatron-core imported before ascend_patch)."""
    import ascend_patch
    from ascend_patch import plugins
    from ascend_patch.hookspec import hookimpl
    from ascend_patch.patch import ModuleShim
    from ascend_patch.shim import ShimModule

    class Plugin:
        @hookimpl
        def ascend_patch_register_patches(self):
            return [ModuleShim("ap_hidden_shim", "test", make=lambda name: ShimModule(name),
                               hidden_from=("ap_importer",))]

    pm = plugins.PluginManager(entry_points=False, builtins=False)
    pm.register(Plugin(), "t", origin="test")
    previous = plugins.reset_plugin_manager(pm)
    try:
        ascend_patch.apply(cpu_settings)
        with pytest.raises(ModuleNotFoundError, match="ap_hidden_shim"):
            _import_as("ap_importer.probe", "import ap_hidden_shim")
        import ap_hidden_shim  # other code gets it

        assert is_shim(ap_hidden_shim)
        # cached now; the next import the hidden-from package starts drops the cached shim
        package = types.ModuleType("ap_importer")
        package.__path__ = []
        sys.modules["ap_importer"] = package
        assert importlib.util.find_spec("ap_importer.probe_that_does_not_exist") is None
        assert "ap_hidden_shim" not in sys.modules
    finally:
        sys.modules.pop("ap_importer", None)
        ascend_patch.remove()
        plugins.reset_plugin_manager(previous)