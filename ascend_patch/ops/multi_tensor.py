"""apex's ``multi_tensor_applier`` and the ``amp_C`` multi-tensor ops, built on ``torch._foreach_*``.

The ops keep apex's calling convention ``op(chunk_size, noop_flag, tensor_lists, *args)``, its overflow flag
(an inf/nan in the checked input sets ``noop_flag`` on the device, never dropped) and its fp32 math.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..backend import current_target

__all__ = [
    "MultiTensorApply",
    "TEMultiTensorApply",
    "adam_update",
    "multi_tensor_adam",
    "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master",
    "multi_tensor_applier",
    "multi_tensor_axpby",
    "multi_tensor_l2norm",
    "multi_tensor_scale",
    "multi_tensor_sgd",
    "optimizer_kernel",
    "sgd_update",
    "te_multi_tensor_applier",
]

_CHUNK = 2048 * 32


class MultiTensorApply:
    """apex's applier: ``applier(op, noop_flag, tensor_lists, *args)`` calls ``op(chunk_size, ...)``."""

    available = True
    warned = False

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """apex raises here when amp_C is missing; the adapted ops are always available."""

    def __call__(self, op: Any, noop_flag_buffer: Tensor, tensor_lists: list[list[Tensor]], *args: Any) -> Any:
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


class TEMultiTensorApply(MultiTensorApply):
    """Transformer Engine's applier: checks aligned lists, drops empty tensors, None when nothing is left."""

    def __call__(self, op: Any, noop_flag_buffer: Tensor, tensor_lists: list[list[Tensor]], *args: Any) -> Any:
        if any(len(ts) != len(tensor_lists[0]) for ts in tensor_lists):
            raise RuntimeError("Expected aligned multi-tensor lists.")
        keep = [t.numel() > 0 for t in tensor_lists[0]]
        for i, ts in enumerate(tensor_lists):
            tensor_lists[i] = [t for t, k in zip(ts, keep) if k]
        if not tensor_lists[0]:
            return None
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(_CHUNK)
te_multi_tensor_applier = TEMultiTensorApply(_CHUNK)


def _lists(tensor_lists: Sequence[Sequence[Tensor]], n: int | tuple[int, ...], op: str) -> None:
    allowed = (n,) if isinstance(n, int) else n
    if len(tensor_lists) not in allowed:
        raise ValueError(f"{op} takes {' or '.join(map(str, allowed))} tensor lists, got {len(tensor_lists)}")
    sizes = {len(ts) for ts in tensor_lists}
    if len(sizes) > 1:
        raise ValueError(f"{op}: the tensor lists must have the same length, got {[len(t) for t in tensor_lists]}")


def _set_flag(noop_flag: Tensor, bad: Tensor) -> None:
    """noop_flag[0] = 1 where ``bad`` (a bool tensor), on the device: no host sync."""
    noop_flag.masked_fill_(bad.to(noop_flag.device).reshape(-1)[:1].expand_as(noop_flag), 1)


def _extremes(t: Tensor) -> tuple[Tensor, ...]:
    """(min, max) of a floating tensor, () of an integer or empty one (always finite).

    nan propagates through both and an inf is one of them, so they tell whether ``t`` is
    finite in one read-only vectorised pass; ``isfinite(t).all()`` writes a bool copy
    first and measured 15x slower on cpu.
    """
    return tuple(torch.aminmax(t)) if t.is_floating_point() and t.numel() else ()


def _nonfinite(extremes: Sequence[Tensor], device: Any) -> Tensor:
    """A bool tensor: some of these extremes is inf or nan (no host sync)."""
    if not extremes:
        return torch.zeros((), dtype=torch.bool, device=device)
    return ~torch.isfinite(torch.stack(list(extremes))).all()


def _any_nonfinite(tensors: Sequence[Tensor]) -> Tensor:
    """A bool tensor: some element is inf or nan (no host sync)."""
    return _nonfinite([e for t in tensors for e in _extremes(t)], tensors[0].device if tensors else None)


def _by_device(*lists: Sequence[Tensor]) -> dict[Any, list[list[Tensor]]]:
    """The aligned lists split by (device, dtype of each list's tensor); one group in the usual case."""
    devices = [t.device for t in lists[0]]
    dtypes = [[t.dtype for t in ts] for ts in lists]
    if len(set(devices)) == 1 and all(len(set(d)) == 1 for d in dtypes):  # checked cheaply, as megatron calls it
        return {(devices[0], tuple(d[0] for d in dtypes)): [list(ts) for ts in lists]}
    groups: dict[Any, list[list[Tensor]]] = defaultdict(lambda: [[] for _ in lists])
    for i, items in enumerate(zip(*lists)):
        for slot, t in zip(groups[(devices[i], tuple(d[i] for d in dtypes))], items):
            slot.append(t)
    return groups


def multi_tensor_scale(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], scale: float) -> None:
    """``out = in * scale`` for lists ``[ins, outs]``; an inf/nan in ``ins`` sets ``noop_flag``."""
    _lists(tensor_lists, 2, "multi_tensor_scale")
    ins, outs = tensor_lists
    if not ins:
        return
    for (device, _), (gin, gout) in _by_device(ins, outs).items():
        if all(a is b for a, b in zip(gin, gout)) and gin[0].is_floating_point():
            # in place: torch's fused amp op checks (before scaling) and scales in one pass
            found = torch.zeros(1, dtype=torch.float32, device=device)
            inv = torch.full((1,), float(scale), dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(gin, found, inv)
            _set_flag(noop_flag, found > 0)
            continue
        if scale == 1.0:
            # megatron's param copies (_multi_tensor_copy_this_to_that, fp32 <-> bf16): each input checked
            # (read only), then copied while it is in cache
            if device.type == "cpu":
                # a host reads its own results for free: a sum (the cheapest reduction: one vectorised
                # pass) is finite whenever every element is and it does not overflow; only when some
                # sum is not is the exact min/max check run
                sums = []
                for src, dst in zip(gin, gout):
                    if src.is_floating_point() and src.numel():
                        sums.append(src.sum())
                    dst.copy_(src)
                if sums and not bool(torch.isfinite(torch.stack(sums)).all()):
                    _set_flag(noop_flag, _any_nonfinite(gin))
                continue
            extremes: list[Tensor] = []
            for src, dst in zip(gin, gout):
                extremes += _extremes(src)
                dst.copy_(src)
            _set_flag(noop_flag, _nonfinite(extremes, device))
            continue
        exact = torch.promote_types(gin[0].dtype, gout[0].dtype) == gout[0].dtype and gout[0].is_floating_point()
        if exact:
            # exact copy into the same or a wider dtype, then the fused check + scale on it while it is in
            # cache: the check sees the input's values and the product is rounded once, in the out dtype
            found = torch.zeros(1, dtype=torch.float32, device=device)
            inv = torch.full((1,), float(scale), dtype=torch.float32, device=device)
            for src, dst in zip(gin, gout):
                dst.copy_(src)
                torch._amp_foreach_non_finite_check_and_unscale_([dst], found, inv)
            _set_flag(noop_flag, found > 0)
            continue
        # narrowing: check the input (a finite fp32 value may round to inf in fp16: apex does not flag it)
        _set_flag(noop_flag, _any_nonfinite(gin))
        torch._foreach_copy_(gout, torch._foreach_mul(gin, scale))


def multi_tensor_l2norm(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]],
                        per_tensor: bool | None = False) -> tuple[Tensor, Tensor]:
    """(global L2 norm as a 1-element fp32 tensor, per-tensor norms or an empty tensor); inf/nan sets the flag."""
    _lists(tensor_lists, 1, "multi_tensor_l2norm")
    tensors = tensor_lists[0]
    device = tensors[0].device if tensors else noop_flag.device
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=device), torch.empty(0, dtype=torch.float32, device=device)
    norms = torch.stack(torch._foreach_norm(list(tensors), 2, dtype=torch.float32))
    total = torch.linalg.vector_norm(norms).reshape(1)
    _set_flag(noop_flag, ~torch.isfinite(total))
    per = norms if per_tensor else torch.empty(0, dtype=torch.float32, device=device)
    return total, per


def multi_tensor_axpby(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]],
                       a: float, b: float, arg_to_check: int) -> None:
    """``out = a*x + b*y`` for ``[xs, ys, outs]``; checks xs (0), ys (1) or both (-1) for inf/nan."""
    _lists(tensor_lists, 3, "multi_tensor_axpby")
    xs, ys, outs = tensor_lists
    if not xs:
        return
    checked = {0: [xs], 1: [ys], -1: [xs, ys]}.get(arg_to_check)
    if checked is None:
        raise ValueError(f"multi_tensor_axpby: arg_to_check must be 0, 1 or -1, got {arg_to_check}")
    for ts in checked:
        _set_flag(noop_flag, _any_nonfinite(ts))
    x32 = [x.float() for x in xs]
    torch._foreach_mul_(x32, a)
    torch._foreach_add_(x32, [y.float() for y in ys], alpha=b)
    torch._foreach_copy_(outs, x32)


# -- Adam ---------------------------------------------------------------------------------

_FUSED_MISSING: set[tuple[str, Any]] = set()  # (device type, kernel) pairs the target has no fused kernel for


def optimizer_kernel(name: str, device: torch.device) -> Any:
    """torch's fused optimizer kernel ``name`` (``_fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``) for
    tensors on ``device``, or None (then the foreach path runs).

    The current target's kernel table decides (npu: torch's op, registered by torch_npu for npu tensors);
    without an entry, host tensors use torch's own cpu kernel, which is the cpu target's implementation.
    """
    kernel = current_target().kernels.get(name)
    if kernel is None and device.type == "cpu":
        kernel = getattr(torch, name, None)
    if kernel is None or (device.type, kernel) in _FUSED_MISSING:
        return None
    return kernel


def _call_fused(kernel: Any, device: torch.device, *args: Any, **kwargs: Any) -> bool:
    try:
        kernel(*args, **kwargs)
    except NotImplementedError:
        _FUSED_MISSING.add((device.type, kernel))  # no kernel for this device/dtype: use the foreach path
        return False
    return True


def _fused_adam(work: list[Tensor], grads: list[Tensor], ms: list[Tensor], vs: list[Tensor], *, step: int,
                lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, adam_w_mode: bool) -> bool:
    """torch's fused Adam(W) step (it always bias-corrects); False when the target has no kernel."""
    device = work[0].device
    kernel = optimizer_kernel("_fused_adamw_" if adam_w_mode else "_fused_adam_", device)
    if kernel is None:
        return False
    # the kernel reads each param's step count (torch.optim increments it before the call)
    steps = [torch.full((), float(step), dtype=torch.float32, device=device)] * len(work)
    return _call_fused(kernel, device, work, grads, ms, vs, [], steps, lr=float(lr), beta1=beta1, beta2=beta2,
                       weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)


def _foreach_adam(work: list[Tensor], grads: list[Tensor], ms: list[Tensor], vs: list[Tensor], *, step: int,
                  lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, adam_w_mode: bool,
                  bias_correction: bool) -> None:
    def f32(ts: list[Tensor]) -> list[Tensor]:
        return [t if t.dtype == torch.float32 else t.float() for t in ts]

    p, g, m, v = f32(work), f32(grads), f32(ms), f32(vs)
    if not adam_w_mode and weight_decay:
        g = torch._foreach_add(g, p, alpha=weight_decay)  # L2 mode: decay joins the gradient
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, value=1 - beta2)
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, math.sqrt(bc2))
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(m, denom)
    torch._foreach_div_(update, bc1)
    if adam_w_mode and weight_decay:
        torch._foreach_add_(update, p, alpha=weight_decay)
    torch._foreach_add_(p, update, alpha=-lr)
    for dst, src in ((work, p), (ms, m), (vs, v)):
        pairs = [(d, s) for d, s in zip(dst, src) if d is not s]
        if pairs:
            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


@torch.no_grad()
def adam_update(grads: Sequence[Tensor], params: Sequence[Tensor], exp_avgs: Sequence[Tensor],
                exp_avg_sqs: Sequence[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, step: int,
                adam_w_mode: bool, bias_correction: bool, weight_decay: float,
                masters: Sequence[Tensor] | None = None) -> None:
    """One apex/TE Adam step, in place. ``masters`` (fp32 copies) are updated instead and copied to ``params``.

    Math in fp32; ``adam_w_mode`` is decoupled decay (AdamW), otherwise decay is added to the gradient.
    The numeric core the optimizers of :mod:`.optim` share: torch's fused kernel (``_fused_adam_`` /
    ``_fused_adamw_``, from the current target, see :func:`optimizer_kernel`) where it computes apex's
    update exactly, a foreach fp32 path otherwise.
    """
    if not params:
        return
    work_all = list(masters) if masters is not None else list(params)
    for (_, dtypes), (g, w, m, v, p) in _by_device(grads, work_all, exp_avgs, exp_avg_sqs, params).items():
        _, wdt, mdt, vdt, _ = dtypes
        kwargs = dict(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                      adam_w_mode=adam_w_mode)
        done = False
        if bias_correction and mdt == vdt and wdt.is_floating_point:
            if wdt == mdt:
                # states stored like the params: torch's fused kernel computes in fp32 and rounds once
                done = _fused_adam(w, [x.to(wdt) for x in g], m, v, **kwargs)
            elif mdt == torch.float32:
                # half params with fp32 states (apex): update fp32 copies, round into the params
                w32 = [x.float() for x in w]
                done = _fused_adam(w32, [x.float() for x in g], m, v, **kwargs)
                if done:
                    torch._foreach_copy_(w, w32)
        if not done:
            _foreach_adam(w, g, m, v, bias_correction=bias_correction, **kwargs)
        if masters is not None:
            torch._foreach_copy_(p, w)


def multi_tensor_adam(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], lr: float,
                      beta1: float, beta2: float, epsilon: float, step: int, mode: int, bias_correction: int,
                      weight_decay: float) -> None:
    """amp_C's ``multi_tensor_adam`` on ``[grads, params, exp_avgs, exp_avg_sqs(, masters)]``.

    Like apex's kernel it propagates inf/nan instead of checking the flag (mode 1 = AdamW).
    """
    _lists(tensor_lists, (4, 5), "multi_tensor_adam")
    g, p, m, v = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) == 5 else None
    adam_update(g, p, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=epsilon, step=int(step), adam_w_mode=bool(mode),
                bias_correction=bool(bias_correction), weight_decay=weight_decay, masters=masters)


def multi_tensor_adam_capturable(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], lr: Tensor,
                                 beta1: float, beta2: float, epsilon: float, step: Tensor, mode: int,
                                 bias_correction: int, weight_decay: float, inv_scale: Tensor) -> None:
    """amp_C's graph-safe Adam: lr/step/inv_scale as tensors, grads times ``inv_scale``, skipped on a set flag.

    (What real apex's FusedAdam(capturable=True) calls; here it reads the tensors on the host.)
    """
    _lists(tensor_lists, (4, 5), "multi_tensor_adam_capturable")
    if bool(noop_flag.reshape(-1)[0].item()):
        return
    g, p, m, v = tensor_lists[:4]
    inv = float(inv_scale.reshape(-1)[0])
    grads = list(g) if inv == 1.0 else torch._foreach_mul([t.float() for t in g], inv)
    adam_update(grads, p, m, v, lr=float(lr.reshape(-1)[0]), beta1=beta1, beta2=beta2, eps=epsilon,
                step=int(step.reshape(-1)[0]), adam_w_mode=bool(mode), bias_correction=bool(bias_correction),
                weight_decay=weight_decay, masters=tensor_lists[4] if len(tensor_lists) == 5 else None)


multi_tensor_adam_capturable_master = multi_tensor_adam_capturable  # the 5-list form: [g, p, m, v, fp32 masters]


# -- SGD ----------------------------------------------------------------------------------

def _fused_sgd(grads: list[Tensor], weights: list[Tensor], momentums: list[Tensor], *, wd: float, momentum: float,
               dampening: float, lr: float, nesterov: bool, first_run: bool, scale: float) -> bool:
    """torch's fused SGD kernel (apex's update when the decay comes before the momentum); False if unusable."""
    same = all(g.dtype == w.dtype == m.dtype and g.device == w.device
               for g, w, m in zip(grads, weights, momentums or weights))
    # with grad_scale the kernel unscales the caller's grads in place: apex only reads them
    if scale != 1.0 or not same or len({w.device for w in weights}) > 1:
        return False
    device = weights[0].device
    kernel = optimizer_kernel("_fused_sgd_", device)
    if kernel is None:
        return False
    return _call_fused(kernel, device, weights, grads, momentums if momentum else [], weight_decay=wd,
                       momentum=momentum, lr=lr, dampening=dampening, nesterov=nesterov, maximize=False,
                       is_first_step=bool(first_run and momentum), grad_scale=None, found_inf=None)


@torch.no_grad()
def sgd_update(grads: Sequence[Tensor], weights: Sequence[Tensor], momentums: Sequence[Tensor], *, wd: float,
               momentum: float, dampening: float, lr: float, nesterov: bool, first_run: bool,
               wd_after_momentum: bool, scale: float = 1.0,
               model_weights_out: Sequence[Tensor] | None = None) -> None:
    """One apex FusedSGD step in fp32 math; ``first_run`` initialises the momentum to the gradient.

    The caller's gradients are only read; weights and momentum buffers are updated in place.
    The current target supplies the fused kernel (see :func:`optimizer_kernel`).
    """
    if not weights:
        return
    weights, momentums = list(weights), list(momentums)
    if not wd_after_momentum and model_weights_out is None and _fused_sgd(
            list(grads), weights, momentums, wd=wd, momentum=momentum, dampening=dampening, lr=lr,
            nesterov=nesterov, first_run=first_run, scale=scale):
        return
    w = [t if t.dtype == torch.float32 else t.float() for t in weights]
    d = [t if t.dtype == torch.float32 else t.float() for t in grads]
    if scale != 1.0:
        d = torch._foreach_mul(d, scale)
    if wd and not wd_after_momentum:
        d = torch._foreach_add(d, w, alpha=wd)
    mom: list[Tensor] = []
    if momentum:
        mom = [t if t.dtype == torch.float32 else t.float() for t in momentums]
        if first_run:
            torch._foreach_copy_(mom, d)
        else:
            torch._foreach_mul_(mom, momentum)
            torch._foreach_add_(mom, d, alpha=1 - dampening)
        d = torch._foreach_add(d, mom, alpha=momentum) if nesterov else mom
    if wd and wd_after_momentum:
        d = torch._foreach_add(d, w, alpha=wd)
    torch._foreach_add_(w, d, alpha=-lr)
    for dst, src in ((weights, w), (momentums if momentum else [], mom)):
        pairs = [(a, b) for a, b in zip(dst, src) if a is not b]
        if pairs:
            torch._foreach_copy_([a for a, _ in pairs], [b for _, b in pairs])
    if model_weights_out is not None:
        torch._foreach_copy_(list(model_weights_out), w)


def multi_tensor_sgd(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], wd: float,
                     momentum: float, dampening: float, lr: float, nesterov: bool, first_run: bool,
                     wd_after_momentum: bool, scale: float) -> None:
    """amp_C's ``multi_tensor_sgd`` on ``[grads, weights, momentums(, fp16 weights out)]``; skipped when the flag is set."""
    _lists(tensor_lists, (3, 4), "multi_tensor_sgd")
    if bool(noop_flag.reshape(-1)[0].item()):
        return  # apex's kernel exits early on a set flag (an overflow was found upstream)
    out = tensor_lists[3] if len(tensor_lists) == 4 else None
    sgd_update(tensor_lists[0], tensor_lists[1], tensor_lists[2], wd=wd, momentum=momentum, dampening=dampening,
               lr=lr, nesterov=nesterov, first_run=first_run, wd_after_momentum=wd_after_momentum, scale=scale,
               model_weights_out=out)
