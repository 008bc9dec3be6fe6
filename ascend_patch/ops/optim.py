"""apex / Transformer Engine fused optimizers on the target, and ``torch.optim`` ``fused=True`` where it is missing."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from copy import deepcopy
from itertools import chain
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import required  # type: ignore[attr-defined]

from ..unsupported import UnsupportedOption
from .multi_tensor import adam_update, sgd_update

__all__ = [
    "ApexFusedAdam",
    "ApexFusedSGD",
    "TEFusedAdam",
    "TEFusedSGD",
    "fused_optimizer_fallback",
    "missing_fused_kernels",
]

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _capturable_refused(cls: str) -> UnsupportedOption:
    return UnsupportedOption(
        f"{cls}(capturable=True) is for CUDA-graph capture, which ascend_patch's target does not "
        "provide; use capturable=False (the update is identical)")


def _run_closure(closure: Callable[[], Any] | None) -> Any:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _check_dtype(p: Tensor, cls: str) -> None:
    if p.dtype not in _SUPPORTED:
        raise RuntimeError(f"{cls} supports fp16, bf16, fp32 and fp64 parameters, got {p.dtype}")


class ApexFusedAdam(torch.optim.Optimizer):
    """``apex.optimizers.FusedAdam`` (a drop-in for ``torch.optim.AdamW``, or ``Adam`` with ``adam_w_mode=False``).

    Per-group int ``step``, fp32 ``exp_avg``/``exp_avg_sq`` whatever the param dtype, ``adam_w_mode``
    (decoupled decay) or L2 mode, ``bias_correction``, ``set_grad_none``. ``amsgrad`` is refused like
    apex; ``capturable`` (CUDA graphs) is refused with what to use instead, and with it ``master_weights``
    (apex allows it only together with ``capturable``). The update is :func:`.multi_tensor.adam_update`:
    torch's fused kernel from the current target's table, read at each step (npu: torch's op, which
    torch_npu registers for npu tensors), or torch's own cpu kernel on the cpu target.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True,
                 capturable: bool = False, master_weights: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant; use torch.optim.Adam(amsgrad=True)")
        if master_weights and not capturable:
            raise RuntimeError("Master weights is currently only supported with the capturable version.")
        if capturable:
            raise _capturable_refused("apex.optimizers.FusedAdam")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.capturable = False
        self.master_weights = False

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Grads to None with ``set_grad_none`` (apex's default), else torch's ``zero_grad``."""
        if set_to_none is None and self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        super().zero_grad() if set_to_none is None else super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, keeping the moments fp32 (torch would cast them to the param dtype)."""
        saved = {k: {n: t.float() if torch.is_tensor(t) and t.is_floating_point() else t for n, t in v.items()}
                 for k, v in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        for saved_id, p in zip(ids, chain.from_iterable(g["params"] for g in self.param_groups)):
            for name, value in saved.get(saved_id, {}).items():
                if torch.is_tensor(value) and value.is_floating_point():
                    self.state[p][name] = value.to(p.device)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, grads: Any = None, output_params: Any = None,
             scale: Any = None, grad_norms: Any = None, grad_scaler: Any = None) -> Any:
        """One Adam step for every param with a gradient."""
        if any(x is not None for x in (grads, output_params, scale, grad_norms)):
            raise RuntimeError("FusedAdam has been updated.  Simply initialize it identically to torch.optim.Adam, "
                               "and call step() with no arguments.")
        loss = _run_closure(closure)
        for group in self.param_groups:
            if not group["params"]:
                continue
            group["step"] = group["step"] + 1 if "step" in group else 1
            g, p, m, v = [], [], [], []
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients, please consider SparseAdam instead")
                _check_dtype(param, "apex.optimizers.FusedAdam")
                state = self.state[param]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                g.append(param.grad)
                p.append(param)
                m.append(state["exp_avg"])
                v.append(state["exp_avg_sq"])
            beta1, beta2 = group["betas"]
            adam_update(g, p, m, v, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], step=group["step"],
                        adam_w_mode=bool(self.adam_w_mode), bias_correction=bool(group["bias_correction"]),
                        weight_decay=group["weight_decay"])
        return loss


class ApexFusedSGD(torch.optim.Optimizer):
    """``apex.optimizers.FusedSGD``: torch SGD's update, plus ``wd_after_momentum`` and amp's grad scale.

    apex's first-run momentum initialisation and ``most_recent_scale``; the update is
    :func:`.multi_tensor.sgd_update` (torch's fused kernel where it computes apex's update).
    """

    _name = "apex.optimizers.FusedSGD"

    def __init__(self, params: Iterable[Any], lr: Any = required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        self.set_grad_none = set_grad_none
        device = self.param_groups[0]["params"][0].device
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Grads to None with ``set_grad_none``, else torch's ``zero_grad``."""
        if set_to_none is None and self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        super().zero_grad() if set_to_none is None else super().zero_grad(set_to_none=set_to_none)

    def get_momentums(self, params: list[Tensor]) -> tuple[list[Tensor], bool]:
        """Momentum buffers (created as zeros when missing) and apex's first-run flag."""
        momentums, first_run = [], True
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                first_run = True
                state["momentum_buffer"] = torch.zeros_like(p)
            else:
                first_run = False
            momentums.append(state["momentum_buffer"])
        return momentums, first_run

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One SGD step per dtype set of each group."""
        if hasattr(self, "_amp_stash"):
            raise UnsupportedOption(f"{self._name} with apex.amp master params is not supported: apex.amp is not "
                                      "provided on this target; use torch.amp (autocast + GradScaler)")
        loss = _run_closure(closure)
        for group in self.param_groups:
            for dtype in _SUPPORTED:
                params = [p for p in group["params"] if p.dtype == dtype and p.grad is not None]
                if not params:
                    continue
                momentums, first_run = self.get_momentums(params)
                sgd_update([p.grad for p in params], params, momentums, wd=group["weight_decay"],
                           momentum=group["momentum"], dampening=group["dampening"], lr=group["lr"],
                           nesterov=group["nesterov"], first_run=first_run, wd_after_momentum=self.wd_after_momentum,
                           scale=1.0 / self.most_recent_scale)
            for p in group["params"]:
                if p.grad is not None:
                    _check_dtype(p, self._name)
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        return loss


class TEFusedSGD(ApexFusedSGD):
    """``transformer_engine.pytorch.optimizers.FusedSGD`` (keyword-only extras; ``set_grad_none`` deprecated)."""

    _name = "transformer_engine.pytorch.optimizers.FusedSGD"

    def __init__(self, params: Iterable[Any], lr: Any = required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool | None = None) -> None:
        if set_grad_none is not None:
            warnings.warn("set_grad_none kwarg in FusedSGD constructor is deprecated. "
                          "Use set_to_none kwarg in zero_grad instead.", DeprecationWarning, stacklevel=2)
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, wd_after_momentum,
                         materialize_master_grads, bool(set_grad_none))


class TEFusedAdam(torch.optim.Optimizer):
    """``transformer_engine.pytorch.optimizers.FusedAdam`` with fp32 master weights and fp32/bf16 moments.

    ``use_decoupled_grad`` too; state dicts hold fp32 states like TE's.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 bias_correction: bool = True, adam_w_mode: bool = True, capturable: bool = False,
                 master_weights: bool = False, master_weight_dtype: torch.dtype = torch.float32,
                 exp_avg_dtype: torch.dtype = torch.float32, exp_avg_sq_dtype: torch.dtype = torch.float32,
                 use_decoupled_grad: bool = False, store_param_remainders: bool = False,
                 set_grad_none: bool | None = None) -> None:
        name = "transformer_engine.pytorch.optimizers.FusedAdam"
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant; use torch.optim.Adam(amsgrad=True)")
        if capturable:
            raise _capturable_refused(name)
        if master_weights and master_weight_dtype != torch.float32:
            raise UnsupportedOption(f"{name}: master_weight_dtype={master_weight_dtype} (scaled fp16 master "
                                      "weights) is not supported here; use master_weight_dtype=torch.float32")
        for label, dt in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dt not in (torch.float32, torch.bfloat16):
                raise UnsupportedOption(f"{name}: {label}={dt} (scaled fp16/fp8 moments) is not supported here; "
                                          "use torch.float32 or torch.bfloat16")
        if store_param_remainders and master_weights:
            raise UnsupportedOption(f"{name}: store_param_remainders=True (bf16 params + int16 remainders) is not "
                                      "supported here; it only saves memory, use store_param_remainders=False")
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = False
        self.master_weights = master_weights
        self.master_weight_dtype = master_weight_dtype
        self.exp_avg_dtype = exp_avg_dtype
        self.exp_avg_sq_dtype = exp_avg_sq_dtype
        self.name_to_dtype_map = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                                  "master_param": master_weight_dtype}
        self.use_decoupled_grad = use_decoupled_grad
        self.store_param_remainders = False
        self.set_grad_none = set_grad_none
        if set_grad_none is not None:
            warnings.warn("set_grad_none kwarg in FusedAdam constructor is deprecated. "
                          "Use set_to_none kwarg in zero_grad instead.", DeprecationWarning, stacklevel=2)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """TE's semantics: ``set_to_none`` (default True) also applies to ``decoupled_grad``."""
        if self.set_grad_none is not None:
            if set_to_none is not None and set_to_none != self.set_grad_none:
                raise ValueError(f"Called zero_grad with set_to_none={set_to_none}, "
                                 f"but FusedAdam was initialized with set_grad_none={self.set_grad_none}")
            set_to_none = self.set_grad_none
        if set_to_none is None:
            set_to_none = True
        if not self.use_decoupled_grad and not set_to_none:
            super().zero_grad(set_to_none=False)
            return
        for group in self.param_groups:
            for p in group["params"]:
                if self.use_decoupled_grad and set_to_none:
                    p.decoupled_grad = None
                elif self.use_decoupled_grad:
                    if getattr(p, "decoupled_grad", None) is not None:
                        p.decoupled_grad.zero_()
                else:
                    p.grad = None

    def _initialize_state(self, param: Tensor, state_name: str, zero_buffer: bool) -> None:
        dtype = self.name_to_dtype_map[state_name]
        data = torch.zeros_like(param, dtype=dtype) if zero_buffer else torch.empty_like(param, dtype=dtype)
        self.state[param][state_name] = data

    def initialize_state(self, param: Tensor, store_param_remainders: bool = False) -> None:
        """Zero moments (and an fp32 master copy with ``master_weights``) for ``param``."""
        self._initialize_state(param, "exp_avg", zero_buffer=True)
        self._initialize_state(param, "exp_avg_sq", zero_buffer=True)
        if self.master_weights:
            self._initialize_state(param, "master_param", zero_buffer=False)
            self.state[param]["master_param"].copy_(param.detach().float())

    def get_unscaled_state(self, param: Tensor, state_name: str, skip_unscale: bool = False) -> Tensor:
        """The state as fp32 (bf16 states stay bf16 with ``skip_unscale``)."""
        value = self.state[param][state_name]
        if value.dtype == torch.bfloat16 and not skip_unscale:
            return value.float()
        return value

    def set_scaled_state(self, param: Tensor, state_name: str, unscaled_state: Tensor) -> None:
        """Store an fp32 state in the configured dtype."""
        if unscaled_state.dtype != torch.float32:
            raise AssertionError(f"set_scaled_state expects an fp32 state, got {unscaled_state.dtype}")
        if state_name not in self.state[param]:
            self._initialize_state(param, state_name, zero_buffer=False)
        self.state[param][state_name].copy_(unscaled_state)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict with every state as fp32 (TE's behaviour)."""
        state_dict = super().state_dict()
        saved_groups = deepcopy(state_dict["param_groups"])
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state_dict["state"][k] = {name: self.get_unscaled_state(param, name) for name in v}
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, restoring each state in its configured dtype (torch would cast to the param dtype)."""
        super().load_state_dict(state_dict)
        saved_groups = deepcopy(state_dict["param_groups"])
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                self.state[param] = {}
                for name, value in v.items():
                    if value is not None:
                        self.set_scaled_state(param, name, value.float().to(param.device))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, grad_scaler: Any = None) -> Any:
        """One Adam step; half params with ``master_weights`` are updated through their fp32 master."""
        loss = _run_closure(closure)
        for group in self.param_groups:
            group["step"] = group["step"] + 1 if "step" in group else 1  # TE counts empty groups too
            if not group["params"]:
                continue
            half: tuple[list[Tensor], ...] = ([], [], [], [], [])
            full: tuple[list[Tensor], ...] = ([], [], [], [])
            half_dtypes = set()
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    self.initialize_state(p)
                grad = getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients.")
                _check_dtype(p, "transformer_engine.pytorch.optimizers.FusedAdam")
                if p.dtype in (torch.float16, torch.bfloat16):
                    half_dtypes.add(p.dtype)
                    lists = half
                else:
                    lists = full
                for slot, t in zip(lists, (grad, p, state["exp_avg"], state["exp_avg_sq"])):
                    slot.append(t)
                if lists is half and self.master_weights:
                    half[4].append(state["master_param"])
            if len(half_dtypes) > 1:
                raise RuntimeError("FusedAdam does not support a mix of float16 and bfloat16 model weights.")
            beta1, beta2 = group["betas"]
            common = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], step=group["step"],
                          adam_w_mode=bool(self.adam_w_mode), bias_correction=bool(group["bias_correction"]),
                          weight_decay=group["weight_decay"])
            if half[0]:
                adam_update(*half[:4], masters=half[4] if self.master_weights else None, **common)
            if full[0]:
                adam_update(*full, **common)
        return loss


# -- torch.optim fused=True where the target lacks the kernel ---------------------------

_PROBED: dict[tuple[str, torch.dtype, bool], bool] = {}


def missing_fused_kernels(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.dtype]]:
    """(device type, dtype) pairs of ``optimizer``'s params for which torch's fused Adam kernel is missing.

    Probes the kernel once per pair on a 1-element tensor of that device (cached).
    """
    adamw = bool(optimizer.param_groups[0].get("decoupled_weight_decay", False)) or isinstance(
        optimizer, torch.optim.AdamW)
    missing = []
    seen = {(p.device, p.dtype) for g in optimizer.param_groups for p in g["params"]}
    for device, dtype in sorted(seen, key=str):
        key = (device.type, dtype, adamw)
        if key not in _PROBED:
            t = [torch.zeros(1, dtype=dtype, device=device) for _ in range(4)]
            step = [torch.zeros((), dtype=torch.float32, device=device)]
            # torch's own op, not the kernel table: it is what torch.optim's fused path will call
            fn = torch._fused_adamw_ if adamw else torch._fused_adam_
            try:
                fn(t[:1], t[1:2], t[2:3], t[3:], [], step, lr=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0,
                   eps=1e-8, amsgrad=False, maximize=False)
                _PROBED[key] = True
            except (NotImplementedError, RuntimeError):
                _PROBED[key] = False
        if not _PROBED[key]:
            missing.append((device.type, dtype))
    return missing


def fused_optimizer_fallback(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                             kwargs: dict[str, Any]) -> None:
    """wrapt wrapper for ``Adam.__init__``: ``fused=True`` falls back to ``foreach`` where the kernel is missing."""
    wrapped(*args, **kwargs)
    if not any(g.get("fused") for g in instance.param_groups):
        return
    missing = missing_fused_kernels(instance)
    if not missing:
        return
    from .. import usage

    usage.note(f"torch.optim.{type(instance).__name__}(fused=True)", "emulated")
    for group in instance.param_groups:
        group["fused"], group["foreach"] = False, True
    instance.defaults["fused"], instance.defaults["foreach"] = False, True
    instance._step_supports_amp_scaling = False  # GradScaler must unscale first for the foreach path
    warnings.warn(f"torch.optim.{type(instance).__name__}(fused=True): the target has no fused kernel for "
                  f"{', '.join(f'{d} {t}' for d, t in missing)}; using foreach=True (same update)", stacklevel=3)
