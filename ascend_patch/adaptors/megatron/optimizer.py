"""megatron-core's distributed optimizer with torch's Adam (no apex / Transformer Engine on the target).

Without apex or TE, megatron-core builds its optimizers on ``torch.optim.Adam``/``AdamW``,
whose per-parameter state holds a ``step`` tensor next to ``exp_avg`` and ``exp_avg_sq``
(apex's FusedAdam keeps the step in the param group instead). Loading a legacy
``distrib_optim.pt`` then fails with ``KeyError: 'step'``: the file carries the
parameter, ``exp_avg`` and ``exp_avg_sq`` shards only, while
``DistributedOptimizer.load_state_dict`` has already restored ``step`` from the param
groups. The patch keeps that restored step when the file has none, and does the copies
with autograd off (for fp32 models the main params are views of the model's leaf
parameters, and an in-place copy into them raises under autograd).

``load_state_dict`` also hands *one* ``step`` tensor to every parameter; torch's Adam
increments each parameter's step in place, so after one step the shared counter has
advanced once per parameter and the bias correction is wrong from the first step after
a resume. The second patch gives each parameter its own copy after loading.
"""

from __future__ import annotations

from typing import Any

from ...patch import Patch, PatchKind
from . import PACKAGE, VERSIONS

__all__ = ["optimizer_patches"]


def _set_states(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    def call(model_param: Any, tensors: dict[str, Any]) -> Any:
        if not getattr(instance.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False):
            group_index, group_order = instance.model_param_group_index_map[model_param]
            main_param = instance.optimizer.param_groups[group_index]["params"][group_order]
            state = instance.optimizer.state[main_param]
            if "step" in state and "step" not in tensors:
                tensors = {**tensors, "step": state["step"]}
        with torch.no_grad():
            return wrapped(model_param, tensors)

    return call(*args, **kwargs)


def _own_steps(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    seen: set[int] = set()
    for state in instance.optimizer.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is not None and hasattr(step, "clone"):
            if id(step) in seen:
                state["step"] = step.detach().clone()
            seen.add(id(step))
    return result


def optimizer_patches() -> list[Patch]:
    dist_opt = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer"
    return [Patch(
        f"{dist_opt}.load_state_dict", PatchKind.WRAP,
        "load_state_dict gives every parameter one shared 'step' tensor, which torch Adam then "
        "increments once per parameter: each parameter gets its own copy",
        wrapper=_own_steps, package=PACKAGE, versions=VERSIONS, count_calls=False), Patch(
        f"{dist_opt}._set_main_param_and_optimizer_states",
        PatchKind.WRAP,
        "torch Adam's per-parameter 'step' is not in distrib_optim.pt (KeyError on load); keep the step "
        "load_state_dict restored, and copy into the main params with autograd off",
        wrapper=_set_states, package=PACKAGE, versions=VERSIONS, count_calls=False)]
