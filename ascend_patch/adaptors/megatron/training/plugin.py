"""The built-in Megatron-LM plugin: every patch Megatron-LM's training entry point needs, in one list.

Megatron-LM's ``megatron/training`` (``initialize_megatron``, ``pretrain``, ``training_log``,
checkpointing, timers) sits on top of megatron-core, whose patches live in
:mod:`ascend_patch.adaptors.megatron`; what the device adaptor already covers
(``torch.cuda.*`` calls, ``device="cuda"``, ``.cuda()``, nccl) is not repeated here.
"""

from __future__ import annotations

from typing import Any

from ....config import Settings
from ....hookspec import Target, hookimpl
from ....patch import Action, ModuleShim, Patch, Replace, Wrap
from ..plugin import ascend_patch_package_version  # megatron-core's release, also when the core plugin is off
from ..releases import needed_on

__all__ = ["ascend_patch_package_version", "ascend_patch_register_patches", "training_patches"]



def training_patches(backend: Any, settings: Any = None) -> list[Patch]:
    """Every Megatron-LM patch for ``backend`` (the registry drops those for other targets).

    ``settings`` (:class:`ascend_patch.config.Settings`) adds the optional ones the user asked for.
    """
    from .. import triton_shim
    from . import arguments, initialize, rng, spec, training_log

    log_path = getattr(settings, "training_log", "")
    optional = [Wrap(
        "megatron.training.training:training_log",
        f"ASCEND_PATCH_TRAINING_LOG: each iteration's losses and grad norm at full precision, to {log_path}",
        wrapper=training_log.TrainingLog(log_path), action=Action.EMULATED, count_calls=False)] if log_path else []
    return [
        *optional,
        # --- shims: modules megatron-core imports unconditionally from Megatron-LM's import chain
        *(ModuleShim(name, "megatron-core modules import triton with no fallback on their import chain (0.16's "
                "batch-invariant kernels, main's MoE paged stash and Mamba ops, ...): while triton is not installed, "
                "serve megatron importers outside a try/except ImportError a triton whose kernels refuse to launch",
                make=triton_shim.build_triton_shim, action=Action.UNSUPPORTED,
                hidden_from=triton_shim.HIDDEN_FROM, api=name)
          for name in triton_shim.TRITON_NAMES),
        # --- initialize_megatron -> validate_args
        Wrap("megatron.training.arguments:validate_args",
             "CUDA_DEVICE_MAX_CONNECTIONS is read by the CUDA driver only: Megatron's checks of it see the value "
              "they ask for (1 with TP/CP, unset with FSDP); the environment is left as the user set it",
              wrapper=arguments.validate_args, action=Action.EMULATED, count_calls=False),
        Wrap("megatron.training.yaml_arguments:validate_yaml",
             "CUDA_DEVICE_MAX_CONNECTIONS is read by the CUDA driver only: the YAML config's checks see 1",
              wrapper=arguments.validate_yaml, action=Action.EMULATED, count_calls=False),
        Replace("megatron.core.tensor_parallel.layers:linear_with_grad_accumulation_and_async_allreduce.warned",
              "megatron-core's once-per-process advice to set CUDA_DEVICE_MAX_CONNECTIONS=1 "
              "for speed: the variable has no effect on the target, so the advice is marked as given",
              replacement=True, action=Action.NOOP, count_calls=False),
        # --- initialize_megatron -> _compile_dependencies
        Wrap("megatron.core.datasets.utils:compile_helpers",
             "a pip-installed megatron-core ships the compiled dataset helpers and no Makefile: skip `make` "
              "when they import", wrapper=initialize.compile_helpers, action=Action.NOOP, count_calls=False,
              ),
        Replace("megatron.legacy.fused_kernels:load",
                "Megatron-LM's fused-kernel build asks nvcc for its version; nothing is built on the target "
              "(the fused ops are ascend_patch's)", replacement=initialize.load_fused_kernels,
              action=Action.NOOP, **needed_on("legacy_fused_kernels")),
        # --- gpt_builders: --spec NAME
        Wrap("megatron.core.transformer.spec_utils:import_module",
             "--spec NAME in Megatron-LM's gpt_builder: a family registered with ascend_patch (Megatron's "
              "'module attribute' form goes through unchanged)", wrapper=spec.import_module, action=Action.EMULATED,
              count_calls=False),
        # --- host-generator draws during setup: on cpu the host generator is also the emulated CUDA one
        *(Wrap(target, reason, wrapper=rng.keep_host_generator, backends=frozenset({"cpu"}),
               action=Action.EMULATED, count_calls=False)
          for target, reason in rng.HOST_DRAWS.items()),
    ]


@hookimpl
def ascend_patch_register_patches(backend: Target, settings: Settings) -> list[Patch]:
    return training_patches(backend, settings)
