"""megatron-core's distributed optimizer: loading a legacy ``distrib_optim.pt`` on the target.

Which Adam megatron-core 0.16 builds depends on what it finds when ``megatron.core.optimizer``
is imported: imported after ascend_patch (``import ascend_patch`` first, ``-m ascend_patch``) it
finds the apex shim and uses its ``FusedAdam``, which keeps the step in the param groups;
imported before, it finds neither apex nor Transformer Engine and uses ``torch.optim.AdamW``
(``HAVE_APEX_OR_TE = False``), whose per-parameter state holds a ``step`` tensor. Both happen
(the docs support applying after megatron-core was imported), and the two wrappers below are
what a resume from Megatron's legacy checkpoint needs in each case
(tests/megatron/test_mcore_dist_optimizer.py resumes a real DistributedOptimizer both ways and
takes each wrapper off again to show what it fixes):

* ``_set_main_param_and_optimizer_states`` (both cases): ``load_parameter_state`` copies the
  file's shards into the main params, which for fp32 models are views of the model's leaf
  parameters; megatron runs that copy with autograd on and it raises ("a view of a leaf
  Variable that requires grad is being used in an in-place operation"). The wrapper runs it
  with autograd off. With torch's AdamW, the file also lacks the ``step`` that the copy
  expects next to ``exp_avg`` / ``exp_avg_sq`` (``KeyError: 'step'``): the step
  ``load_state_dict`` restored from the param groups is kept.
* ``load_state_dict`` (torch's AdamW): megatron hands *one* ``step`` tensor to every
  parameter; torch's Adam increments each parameter's step in place, so the shared counter
  advances once per parameter per step and the bias correction is wrong from the second step
  after a resume. Each parameter gets its own copy. (With apex's FusedAdam it finds no
  per-parameter step and does nothing.)
"""

from __future__ import annotations

from typing import Any

from ...patch import Patch, Wrap
from .releases import needed_on

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
    return [Wrap(
        f"{dist_opt}.load_state_dict",
        "load_state_dict gives every parameter one shared 'step' tensor, which torch Adam then "
        "increments once per parameter: each parameter gets its own copy",
        wrapper=_own_steps, **needed_on(),  count_calls=False), Wrap(
        f"{dist_opt}._set_main_param_and_optimizer_states",
        "torch Adam's per-parameter 'step' is not in distrib_optim.pt (KeyError on load); keep the step "
        "load_state_dict restored, and copy into the main params with autograd off",
        wrapper=_set_states, **needed_on(),  count_calls=False)]
