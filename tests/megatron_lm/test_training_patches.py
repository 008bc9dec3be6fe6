"""The Megatron-LM plugin's patches, one by one, in this process (the launches are in test_pretrain_gpt_*)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from ascend_patch.adaptors.megatron.training import arguments, initialize, training_log
from ascend_patch.adaptors.megatron.training.plugin import training_patches
from ascend_patch.backend import cpu_backend
from ascend_patch.config import Settings


def test_every_megatron_lm_patch_is_ranged_and_the_log_patch_exists_only_when_asked():
    plain = training_patches(cpu_backend())
    for patch in plain:
        if patch.target.startswith("megatron."):  # every release, or the ones a fact of releases.py names
            assert patch.versions is None and (patch.package is None or patch.needed), patch.target
        assert patch.reason
    targets = {p.target for p in plain}
    assert "megatron.training.training:training_log" not in targets
    assert {"megatron.legacy.fused_kernels:load", "megatron.core.datasets.utils:compile_helpers",
            "megatron.training.arguments:validate_args", "triton"} <= targets
    logged = training_patches(cpu_backend(), Settings(training_log="/tmp/x.jsonl"))
    assert "megatron.training.training:training_log" in {p.target for p in logged}


def test_compile_helpers_skips_make_only_when_the_compiled_helpers_import(monkeypatch):
    calls = []

    def make(*args, **kwargs):
        calls.append(args)
        return "built"

    assert initialize.compile_helpers(make, None, (), {}) is None  # the wheel ships helpers_cpp
    assert calls == []
    monkeypatch.setattr(initialize, "HELPERS_MODULE", "megatron.core.datasets.no_such_helpers")
    assert initialize.compile_helpers(make, None, (), {}) == "built"  # a source tree still builds
    assert calls == [()]


def test_compile_helpers_under_the_patch_never_runs_make(patched, monkeypatch):
    import megatron.core.datasets.utils as dutils

    def no_make(*args, **kwargs):
        raise AssertionError(f"make was run: {args}")

    monkeypatch.setattr(subprocess, "run", no_make)
    assert dutils.compile_helpers() is None
    from megatron.core.datasets import helpers  # the compiled module the build would have made

    assert helpers.build_sample_idx_int32 is not None


def _run_validate(namespace, environ_value, monkeypatch):
    if environ_value is None:
        monkeypatch.delenv(arguments.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(arguments.VARIABLE, environ_value)
    seen = []
    arguments.validate_args(lambda args, defaults=None: seen.append(os.environ.get(arguments.VARIABLE)),
                            None, (namespace, {}), {})
    return seen[0], os.environ.get(arguments.VARIABLE)


@pytest.mark.parametrize("user_value", [None, "8"])
def test_validate_args_sees_what_megatron_asks_for_and_the_environment_is_put_back(monkeypatch, user_value):
    tp2 = types.SimpleNamespace(tensor_model_parallel_size=2, context_parallel_size=1)
    cp2 = types.SimpleNamespace(tensor_model_parallel_size=1, context_parallel_size=2)
    fsdp = types.SimpleNamespace(tensor_model_parallel_size=2, context_parallel_size=1, use_megatron_fsdp=True)
    plain = types.SimpleNamespace(tensor_model_parallel_size=1, context_parallel_size=1)
    assert _run_validate(tp2, user_value, monkeypatch) == ("1", user_value)
    assert _run_validate(cp2, user_value, monkeypatch) == ("1", user_value)
    assert _run_validate(fsdp, user_value, monkeypatch) == (None, user_value)
    assert _run_validate(plain, user_value, monkeypatch) == (user_value, user_value)
    seen = []
    arguments.validate_yaml(lambda args, defaults=None: seen.append(os.environ.get(arguments.VARIABLE)), None,
                            (plain,), {})
    assert seen == ["1"] and os.environ.get(arguments.VARIABLE) == user_value  # its checks only ask for 1


def test_validate_args_puts_the_environment_back_when_megatron_refuses(monkeypatch):
    monkeypatch.delenv(arguments.VARIABLE, raising=False)

    def refuse(args, defaults=None):
        raise AssertionError("some other argument is wrong")

    with pytest.raises(AssertionError, match="some other argument"):
        arguments.validate_args(refuse, None, (types.SimpleNamespace(tensor_model_parallel_size=2),), {})
    assert arguments.VARIABLE not in os.environ


def test_the_speed_advice_is_marked_given_and_restored(cpu_settings):
    import ascend_patch
    from megatron.core.tensor_parallel import layers

    fn = layers.linear_with_grad_accumulation_and_async_allreduce
    before = fn.warned
    ascend_patch.apply(cpu_settings)
    try:
        assert fn.warned is True
    finally:
        ascend_patch.remove()
    assert fn.warned is before


def test_the_training_log_writes_full_precision_records_on_the_printing_rank(tmp_path):
    path = tmp_path / "log.jsonl"
    log = training_log.TrainingLog(str(path))

    def training_log_stock(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, report_memory_flag,
                           skipped_iter, grad_norm, params_norm, num_zeros_in_grad, max_attention_logit,
                           pg_collection=None, is_first_iteration=False):
        return "flag"

    loss = torch.tensor(5.545461654663086, dtype=torch.float32)
    assert log(training_log_stock, None, ({"lm loss": loss}, {}, 7.75e-4, 1, 1.0, True, 0, 1.2075127363204956,
                                          None, None, None), {"is_first_iteration": True}) == "flag"
    assert log(training_log_stock, None, ({}, {}, 7.75e-4, 2, 1.0, True, 0, 1.1, None, None, None), {}) == "flag"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [{"iteration": 1, "losses": {"lm loss": loss.item()}, "grad_norm": 1.2075127363204956,
                        "learning_rate": 7.75e-4, "loss_scale": 1.0, "skipped": False, "params_norm": None,
                        "num_zeros_in_grad": None}]  # iteration 2 had no losses here (not the last stage)
    assert records[0]["losses"]["lm loss"] == float(loss)  # the exact fp32 value, not the printed 5.545462


def test_fused_kernels_load_is_a_no_op_and_restored(megatron_lm, cpu_settings, monkeypatch):
    import ascend_patch

    monkeypatch.syspath_prepend(str(megatron_lm.root))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "")  # the module sets it at import; monkeypatch restores it
    from megatron.legacy import fused_kernels

    original = fused_kernels.load
    with pytest.raises(Exception):  # what every launch died of: nvcc is not there
        original(types.SimpleNamespace(rank=0))
    ascend_patch.apply(cpu_settings)
    try:
        assert fused_kernels.load(types.SimpleNamespace(rank=0)) is None
    finally:
        ascend_patch.remove()
    assert fused_kernels.load is original


def test_building_data_iterators_leaves_the_generator_where_it_was():
    from ascend_patch.adaptors.megatron.training.rng import keep_host_generator as keep_device_stream

    torch.manual_seed(7)
    before = torch.get_rng_state()

    def build(provider):
        torch.empty((), dtype=torch.int64).random_()  # what iter(DataLoader) draws for its workers' seed
        return provider, "iterators"

    assert keep_device_stream(build, None, ("provider",), {}) == ("provider", "iterators")
    assert torch.equal(torch.get_rng_state(), before)

    def fails(provider):
        torch.rand(3)
        raise RuntimeError("no data")

    with pytest.raises(RuntimeError, match="no data"):
        keep_device_stream(fails, None, ("provider",), {})
    assert torch.equal(torch.get_rng_state(), before)


WARM_UP_CHILD = """
import json, types, torch
import ascend_patch                                       # applies the cpu target (ASCEND_PATCH_DEVICE=cpu)
from megatron.training import global_vars, initialize     # imports triton: served by the shim while applied

patched = initialize._warmup_jit_function
original = patched.__wrapped__
# the sizes Megatron-LM's warm-up reads, at TP2 CP2 (other tensor sizes than at TP1 CP1)
global_vars._GLOBAL_ARGS = types.SimpleNamespace(
    bf16=False, fp16=False, ffn_hidden_size=128, hidden_size=64, seq_length=64, micro_batch_size=2,
    tensor_model_parallel_size=2, context_parallel_size=2, swiglu=False, sequence_parallel=False)
torch.manual_seed(1234)
seeded = torch.get_rng_state()
original()                                                # the warm-up itself draws "on cuda": the host here
moved = not torch.equal(torch.get_rng_state(), seeded)
torch.manual_seed(1234)
initialize.set_jit_fusion_options()                       # what pretrain() calls between seeding and the model
kept = torch.equal(torch.get_rng_state(), seeded)
ascend_patch.remove()
print(json.dumps({"moved": moved, "kept": kept, "restored": initialize._warmup_jit_function is original}))
"""


def test_the_jit_warm_up_leaves_the_host_generator_as_seeded_and_is_restored(megatron_lm):
    from helpers import child_env

    env = child_env(ASCEND_PATCH_DEVICE="cpu", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(megatron_lm.root), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-c", WARM_UP_CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"moved": True, "kept": True, "restored": True}


def test_the_generator_patches_are_for_the_cpu_target_only():
    from ascend_patch.patching.manager import PatchRegistry
    from ascend_patch.adaptors.megatron.plugin import megatron_patches
    from ascend_patch.backend import Backend

    cpu_only = {"megatron.training.training:build_train_valid_test_data_iterators",
                "megatron.training.initialize:_warmup_jit_function",
                "megatron.core.pipeline_parallel.p2p_communication:_p2p_ops"}
    npu = Backend("npu", "npu", "hccl", None, keeps_index=True)
    registered = {}
    for backend in (cpu_backend(), npu):
        registry = PatchRegistry(backend)
        registry.extend([*training_patches(backend), *megatron_patches(backend)])
        registered[backend.name] = {p.target for p in registry.patches()}
    # on npu the NPU generator is separate from the host's and HCCL keeps sent storage alive
    assert cpu_only <= registered["cpu"] and not cpu_only & registered["npu"]
    assert registered["cpu"] - cpu_only >= registered["npu"] - {"megatron.core.tensor_parallel.random:CudaRNGStatesTracker.fork"}
    assert "megatron.legacy.fused_kernels:load" in registered["npu"] and "triton" in registered["npu"]


def test_spec_takes_a_registered_name_and_leaves_megatrons_form_alone(monkeypatch):
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    from ascend_patch.adaptors.megatron.training import spec
    from ascend_patch.models.registry import UnknownSpec

    calls = []

    def stock(module_path):
        calls.append(module_path)
        return "megatron's"

    assert spec.import_module(stock, None, (["some.module", "layer_spec"],), {}) == "megatron's"
    assert calls == [["some.module", "layer_spec"]]
    qwen3 = spec.import_module(stock, None, (["qwen3"],), {})
    assert isinstance(qwen3, ModuleSpec)
    attention = qwen3.submodules.self_attention.submodules
    assert attention.q_layernorm not in (None, IdentityOp) and attention.k_layernorm not in (None, IdentityOp)
    assert calls == [["some.module", "layer_spec"]]
    with pytest.raises(UnknownSpec, match="unknown model spec 'qwen4'; known: .*qwen3"):
        spec.import_module(stock, None, (["qwen4"],), {})


def test_batch_invariant_mode_is_refused_naming_the_flag_while_triton_is_missing(monkeypatch):
    import importlib.util

    from ascend_patch.adaptors.megatron.triton_shim import TritonUnavailable

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real_find_spec(name, *a))
    called = []
    asked = types.SimpleNamespace(tensor_model_parallel_size=1, batch_invariant_mode=True)
    with pytest.raises(TritonUnavailable, match="Remove --batch-invariant-mode"):
        arguments.validate_args(lambda args, defaults=None: called.append(args), None, (asked, {}), {})
    assert called == []  # refused before megatron builds anything
    plain = types.SimpleNamespace(tensor_model_parallel_size=1, batch_invariant_mode=False)
    arguments.validate_args(lambda args, defaults=None: called.append(args), None, (plain, {}), {})
    assert called == [plain]
