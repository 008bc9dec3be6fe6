"""Launchers that size a run from the device count, on the cpu target.

``accelerate launch --num_processes N`` (without ``--multi_gpu``), ``torchrun --nproc-per-node gpu``
and ``mp.spawn(fn, nprocs=torch.cuda.device_count())`` start as many processes as the launching
process sees devices: on the cpu target, :func:`ascend_patch.cpu_host.device_source`'s count
(``ASCEND_PATCH_CPU_DEVICES`` says it once for every patched process), and only when that process
is patched at all (``ASCEND_PATCH_AUTOLOAD=1`` for a launcher; unpatched on a CPU host it sees no
GPU). What this module adds, once per process:

* accelerate's launcher (patched) asked for more processes per node than it sees devices, which
  makes it start one process: a warning saying so and what to set;
* a worker that ``accelerate launch`` started alone although it was asked for several (its
  single-process launcher sets ``MASTER_PORT`` only then, and no ``WORLD_SIZE``), or one of more
  local ranks than there are virtual devices: a warning when the patches are applied.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from ...cpu_host import CPU_DEVICES, device_source
from ...patch import Action, Patch, Wrap

__all__ = ["accelerate_launch_warning", "launcher_patches", "warn_about_this_launch", "worker_launch_warning"]

_warned: set[str] = set()
_ASKED_ALONE = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND", "MASTER_PORT")  # accelerate's single launcher


def _warn_once(key: str, message: str, stacklevel: int) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=stacklevel)


def worker_launch_warning(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process has fewer devices or peers than its launcher was asked for, or None."""
    env = os.environ if environ is None else environ
    count, why = device_source(env)
    launcher_warned = env.get("ASCEND_PATCH_AUTOLOAD", "").strip() == "1"  # it was patched and said so itself
    if (all(name in env for name in _ASKED_ALONE) and "WORLD_SIZE" not in env and "RANK" not in env
            and not launcher_warned):
        return ("ascend_patch: `accelerate launch` started this process alone although it was asked for more "
                "than one (it set MASTER_PORT, which its single-process launcher does only then, and no "
                "WORLD_SIZE): accelerate sizes a run from the devices its own process sees, and that process is "
                "not patched (a CPU host has no GPU). Run it patched and say how many devices the node has: "
                f"ASCEND_PATCH_AUTOLOAD=1 {CPU_DEVICES}=N accelerate launch --num_processes N ..., or pass "
                "--multi_gpu")
    local = env.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > count and env.get("LOCAL_RANK") == "0":
        return (f"ascend_patch: the launcher started {local} processes on this node, but the cpu target presents "
                f"{count} virtual device(s) ({why}): torch.cuda.set_device(local_rank) fails on local ranks "
                f"{count} to {int(local) - 1}; set {CPU_DEVICES}={local} (or unset it and CUDA_VISIBLE_DEVICES) or "
                f"start {count} per node")
    return None


def warn_about_this_launch(target: Any) -> None:
    """Warn once, when the cpu target is applied, if this process's launch left it short of devices or peers."""
    if target.name != "cpu":
        return
    message = worker_launch_warning()
    if message is not None:
        _warn_once("worker", message, stacklevel=2)


def accelerate_launch_warning(launch_args: Any) -> str | None:
    """What accelerate's launcher (patched) will start short of, for its validated arguments, or None."""
    asked = getattr(launch_args, "num_processes", None)
    if not asked or asked <= 1 or getattr(launch_args, "cpu", False):
        return None
    multi = ("multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu")
    if any(getattr(launch_args, name, False) for name in multi):
        return None  # torchrun starts them all; each worker checks its own devices
    count, why = device_source()
    per_node = max(1, asked // max(1, getattr(launch_args, "num_machines", 1) or 1))
    return (f"ascend_patch: accelerate launch was asked for {asked} processes, but this launcher sees {count} "
            f"virtual device(s) on the cpu target ({why}), so accelerate starts one process (world size 1). "
            f"Say how many devices the node has: {CPU_DEVICES}={per_node} accelerate launch ... (this launcher is "
            "patched, so that is enough), or pass --multi_gpu")


def _validate_launch_command(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    launch_args = result[0] if isinstance(result, tuple) else result
    message = accelerate_launch_warning(launch_args)
    if message is not None:
        _warn_once("accelerate", message, stacklevel=4)
    return result


def launcher_patches() -> list[Patch]:
    """The cpu target's launcher check: accelerate's, when its launcher process is patched."""
    return [Wrap("accelerate.commands.launch:_validate_launch_command",
                 "accelerate launch sized from the virtual devices: a warning when it will start fewer processes "
                 f"than asked ({CPU_DEVICES})", wrapper=_validate_launch_command, backends=frozenset({"cpu"}),
                 action=Action.EMULATED, count_calls=False)]
