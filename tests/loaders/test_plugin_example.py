"""examples/plugins/ascend-patch-phi3, installed by pip for real (a dist-info with its entry
point, in a directory put on PYTHONPATH), then used the way a user would: the CLI converts a
Phi-3 checkpoint to Megatron TP2 x PP2 and back with the plugin's loader and saver, the
result loads in transformers, and stock megatron-core gives transformers' logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ascend_patch.models.vocab import padded_vocab_size
from helpers import REPO, child_env
from loaders_tiny import hf_state, reference_logits
from mcore_numerics import assert_logits_match, launch

EXAMPLE = os.path.join(REPO, "examples", "plugins", "ascend-patch-phi3")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example installed with pip into its own directory (no dependencies: this venv has them)."""
    import shutil

    target = tmp_path_factory.mktemp("phi3_site")
    source = tmp_path_factory.mktemp("phi3_src") / "ascend-patch-phi3"
    shutil.copytree(EXAMPLE, source)  # setuptools builds in the source tree: not in the repository's
    try:
        import setuptools  # noqa: F401  (the example's build backend: build in this environment)
        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []  # pip fetches setuptools from the package index
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    infos = [p for p in os.listdir(target) if p.endswith(".dist-info")]
    assert infos == ["ascend_patch_phi3-0.1.0.dist-info"], infos
    entry_points = (target / infos[0] / "entry_points.txt").read_text()
    assert "[ascend_patch]" in entry_points and "phi3 = ascend_patch_phi3.plugin" in entry_points
    return str(target)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """A tiny random Phi-3 checkpoint as transformers saves it (fused qkv_proj / gate_up_proj)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    config = Phi3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, sliding_window=None)
    model = Phi3ForCausalLM(config).eval()
    path = str(tmp_path_factory.mktemp("phi3") / "hf")
    model.save_pretrained(path)
    return path, model


def cli(site, *args, check=True):
    env = child_env(PYTHONPATH=os.pathsep.join([site, REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "ascend_patch.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def converted(site, phi3, tmp_path_factory):
    hf, _ = phi3
    root = tmp_path_factory.mktemp("phi3_convert")
    mg, back = str(root / "mg"), str(root / "back")
    to_mg = cli(site, "convert", "--loader", "phi3_hf", "--saver", "mg", "--target-tensor-parallel-size", "2",
                "--target-pipeline-parallel-size", "2", "--load-dir", hf, "--save-dir", mg, "--verify")
    to_hf = cli(site, "convert", "--load-model-type", "mg", "--save-model-type", "phi3_hf",
                "--load-dir", mg, "--save-dir", back)
    return mg, back, to_mg.stdout, to_hf.stdout


def test_installed_plugin_contributes_spec_loader_and_saver(site):
    code = ("from ascend_patch.plugins import get_plugin_manager\n"
            "from ascend_patch.models.registry import resolve_spec\n"
            "from ascend_patch.loaders.formats import get_format_registry\n"
            "pm = get_plugin_manager(); r = get_format_registry()\n"
            "print(pm.origins['phi3'], resolve_spec('phi3').owner, resolve_spec('phi-3').name,\n"
            "      type(r.loader('phi3_hf')).__name__, type(r.saver('phi3_hf')).__name__, r.plugin_of('loader', 'phi3_hf'))\n")
    env = child_env(PYTHONPATH=os.pathsep.join([site, REPO]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["ascend-patch-phi3", "phi3", "phi3", "Phi3Loader", "Phi3Saver", "phi3"]


def test_doctor_lists_the_plugin_and_what_it_contributes(site, tmp_path):
    out = cli(site, "doctor").stdout
    assert "                phi3 (ascend-patch-phi3): spec phi3, loader phi3_hf, saver phi3_hf\n" in out


def test_without_the_plugin_the_name_is_unknown_and_says_how_to_add_one(phi3, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ascend_patch.cli", "convert", "--loader", "phi3_hf",
                           "--load-dir", phi3[0], "--save-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode != 0
    assert "unknown checkpoint loader 'phi3_hf'" in proc.stderr and "entry-point group 'ascend_patch'" in proc.stderr


def test_convert_to_megatron_and_back_is_exact(converted, phi3):
    mg, back, to_mg, to_hf = converted
    assert "source: phi3_hf checkpoint of a phi3 model" in to_mg
    assert "target: megatron legacy, TP 2, PP 2" in to_mg and "verify OK" in to_mg
    assert sorted(os.listdir(os.path.join(mg, "iter_0000001"))) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    original, again = hf_state(phi3[0]), hf_state(back)
    assert sorted(again) == sorted(original)
    assert "model.layers.3.self_attn.qkv_proj.weight" in again and "model.layers.0.mlp.gate_up_proj.weight" in again
    for key, value in original.items():
        assert torch.equal(again[key], value), key


def test_megatron_shards_hold_the_unfused_tensors(converted, phi3):
    """TP rank 1's linear_fc1 is [gate rows 48:96; up rows 48:96] of the fused gate_up_proj."""
    mg = converted[0]
    state = torch.load(os.path.join(mg, "iter_0000001", "mp_rank_01_000", "model_optim_rng.pt"),
                       map_location="cpu", weights_only=False)["model"]
    fused = hf_state(phi3[0])["model.layers.0.mlp.gate_up_proj.weight"]
    gate, up = fused[:96], fused[96:]
    assert torch.equal(state["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[48:], up[48:]]))


def test_round_trip_loads_in_transformers_with_the_same_logits(converted, phi3):
    from transformers import Phi3ForCausalLM

    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(3))
    reloaded = Phi3ForCausalLM.from_pretrained(converted[1]).eval()
    assert torch.equal(reference_logits(reloaded, ids), reference_logits(phi3[1], ids))


def test_builtin_hf_format_points_to_the_plugin(site, phi3, converted, tmp_path):
    refused = cli(site, "convert", "--loader", "hf", "--load-dir", phi3[0], "--save-dir", str(tmp_path / "a"),
                  check=False)
    assert refused.returncode != 0
    assert "the 'hf' loader does not read; use --loader phi3_hf (from plugin phi3)" in refused.stderr
    refused = cli(site, "convert", "--loader", "mg", "--saver", "hf", "--load-dir", converted[0],
                  "--save-dir", str(tmp_path / "b"), check=False)
    assert "the 'hf' saver does not write; use --saver phi3_hf" in refused.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_megatron_lm_written_phi3_checkpoint_is_recognised_by_its_args(site, converted, phi3, tmp_path):
    """Without the HF config ascend-patch stores, the family comes from the args Megatron-LM saves: llama's
    arguments plus a Phi-3 tokenizer, which only the plugin's matcher knows; the plugin's config map writes
    the config.json transformers loads."""
    import argparse
    import shutil

    from transformers import Phi3ForCausalLM

    mg, back = str(tmp_path / "mg"), str(tmp_path / "back")
    shutil.copytree(converted[0], mg)
    for dirpath, _, files in os.walk(mg):
        for name in (n for n in files if n.endswith(".pt")):
            full = os.path.join(dirpath, name)
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(full, weights_only=True)
            state.pop("ascend_patch")
            state["args"].tokenizer_model = "microsoft/Phi-3-mini-4k-instruct"
            torch.save(state, full)
    out = cli(site, "convert", "--load-model-type", "mg", "--save-model-type", "phi3_hf", "--true-vocab-size", "300",
              "--load-dir", mg, "--save-dir", back).stdout
    assert "source: mg checkpoint of a phi3 model (TP 2, PP 2, local naming)" in out
    with open(os.path.join(back, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Phi3ForCausalLM"]
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(4))
    reloaded = Phi3ForCausalLM.from_pretrained(back).eval()
    assert torch.equal(reference_logits(reloaded, ids), reference_logits(phi3[1], ids))


def test_args_reads_the_phi3_config(site, phi3):
    out = cli(site, "args", "--hf-config", os.path.join(phi3[0], "config.json")).stdout
    for flag in ("--num-layers 4", "--hidden-size 64", "--ffn-hidden-size 96", "--num-attention-heads 4",
                 "--num-query-groups 2", "--swiglu", "--untie-embeddings-and-output-weights"):
        assert flag in out, flag


@pytest.mark.slow
def test_stock_megatron_core_gives_transformers_logits(converted, phi3, tmp_path):
    mg = converted[0]
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(7))
    torch.save({"input_ids": ids, "logits": reference_logits(phi3[1], ids)}, tmp_path / "inputs.pt")
    case = dict(name="phi3-2-2", tp=2, pp=2, vpp=1, mg_dir=mg, hf_config=os.path.join(phi3[0], "config.json"),
                inputs=str(tmp_path / "inputs.pt"), padded_vocab=padded_vocab_size(300, 128, 2), vocab=300)
    assert_logits_match(launch([case], tmp_path)["phi3-2-2"])
