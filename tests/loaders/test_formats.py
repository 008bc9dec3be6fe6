"""Loaders and savers as plugins: names, aliases, clear errors, and a third-party loader found by entry point."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ascend_patch.loaders.formats import CheckpointLoader, FormatRegistry, UnknownFormat, get_format_registry


@pytest.mark.parametrize("name,expected", [("hf", "hf"), ("qwen_hf", "hf"), ("llama_hf", "hf"), ("QWEN3_HF", "hf"),
                                           ("llama_mistral", "hf"), ("mg", "mg"), ("mcore", "mg"), ("core", "mg"),
                                           ("megatron", "mg")])
def test_names_used_by_existing_tools_resolve(name, expected):
    registry = get_format_registry(refresh=True)
    assert registry.loader(name).name == expected
    assert registry.plugin_of("loader", name) == "loaders"


def test_unknown_name_lists_the_available_ones_and_how_to_register():
    registry = get_format_registry()
    with pytest.raises(UnknownFormat) as info:
        registry.loader("qwen4_hf")
    text = str(info.value)
    assert "unknown checkpoint loader 'qwen4_hf'" in text
    assert "hf (aliases: " in text and "qwen_hf" in text and "mg (aliases: " in text and "mcore" in text
    assert "ascend_patch_checkpoint_loaders" in text and "entry-point group 'ascend_patch'" in text
    with pytest.raises(UnknownFormat, match="unknown checkpoint saver 'zarr'"):
        registry.saver("zarr")


def test_a_name_claimed_twice_names_both_plugins():
    class A(CheckpointLoader):
        name, aliases = "a", ("shared",)

        def open(self, path, options):
            raise NotImplementedError

    class B(A):
        name, aliases = "b", ("shared",)

    registry = FormatRegistry()
    registry.add("loader", A(), "plugin_one")
    with pytest.raises(ValueError, match="'shared' is claimed by plugin plugin_one .a. and by plugin plugin_two .b."):
        registry.add("loader", B(), "plugin_two")


PLUGIN = '''
"""A third-party loader: config.json + weights.npz holding tensors under their HF names."""
import os

import numpy as np
import torch

from ascend_patch.hookspec import hookimpl
from ascend_patch.loaders.formats import CheckpointLoader, TensorInfo
from ascend_patch.loaders.hf import source_from_hf_tensors
from ascend_patch.models.hf_config import read_config_json


class NpzLoader(CheckpointLoader):
    name = "npz"
    aliases = ("numpy_hf",)
    description = "config.json + weights.npz (HF names)"

    def detect(self, path):
        return os.path.isfile(os.path.join(path, "weights.npz"))

    def open(self, path, options):
        arrays = np.load(os.path.join(path, "weights.npz"), allow_pickle=False)
        tensors = {}
        for key in arrays.files:
            array = arrays[key]
            tensors[key] = TensorInfo(path=os.path.join(path, "weights.npz"), shape=tuple(array.shape),
                                      dtype="float32",
                                      reader=lambda a, b, array=array: torch.from_numpy(array[a:b].copy()))
        return source_from_hf_tensors(self.name, path, read_config_json(path), tensors, options)


@hookimpl
def ascend_patch_checkpoint_loaders():
    return [NpzLoader()]
'''


def test_third_party_loader_from_an_entry_point(tmp_path, hf_checkpoint):
    import numpy as np
    import torch

    from loaders_tiny import child_env, hf_state

    hf, _ = hf_checkpoint("qwen2")
    site = tmp_path / "site"
    (site / "npz_ckpt_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "npz_ckpt_plugin.py").write_text(PLUGIN)
    (site / "npz_ckpt_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: npz-ckpt-plugin\nVersion: 0.1\n")
    (site / "npz_ckpt_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[ascend_patch]\nnpz_ckpt = npz_ckpt_plugin\n")
    src = tmp_path / "npz"
    src.mkdir()
    state = hf_state(hf)
    np.savez(src / "weights.npz", **{k: v.numpy() for k, v in state.items()})
    (src / "config.json").write_text(open(f"{hf}/config.json").read())
    script = textwrap.dedent(f"""
        import json
        from ascend_patch.loaders.formats import ConvertOptions, get_format_registry
        from ascend_patch.loaders.engine import convert
        reg = get_format_registry()
        convert({str(src)!r}, {str(tmp_path / 'mg')!r}, "numpy_hf", "mg", ConvertOptions(target_tp=2))
        convert({str(tmp_path / 'mg')!r}, {str(tmp_path / 'hf')!r}, "mg", "hf", ConvertOptions())
        print(json.dumps({{"plugin": reg.plugin_of("loader", "npz"), "listing": reg.listing("loader")}}))
    """)
    env = child_env(ASCEND_PATCH="0")
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["plugin"] == "npz_ckpt" and "npz (aliases: numpy_hf)" in got["listing"]
    back = hf_state(str(tmp_path / "hf"))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_the_deprecated_extra_bag_still_works_with_a_warning():
    """Savers written against ConvertOptions.extra keep working: its keys are typed fields now."""
    import dataclasses

    from ascend_patch.loaders import ConvertOptions

    with pytest.warns(DeprecationWarning, match="typed fields"):
        options = ConvertOptions(target_tp=2, extra={"moe_grouped_gemm": True, "family_hint": "qwen3",
                                                     "zip_crc": False, "my_plugin_key": 7})
    assert (options.target_tp, options.moe_grouped_gemm, options.family_hint, options.zip_crc) == (2, True, "qwen3",
                                                                                                   False)
    with pytest.warns(DeprecationWarning, match="typed fields"):
        assert dict(options.extra) == {"moe_grouped_gemm": True, "family_hint": "qwen3", "zip_crc": False,
                                       "my_plugin_key": 7}
    replaced = dataclasses.replace(options, target_tp=4)  # the plugin's own key survives a replace
    with pytest.warns(DeprecationWarning):
        assert (replaced.target_tp, replaced.extra["my_plugin_key"]) == (4, 7)
    with pytest.warns(DeprecationWarning):
        assert dict(ConvertOptions().extra) == {}
