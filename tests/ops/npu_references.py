"""REFERENCE implementations of the documented torch_npu kernel semantics, for tests only.

These are not torch_npu and were never run against an NPU. They implement what the
torch_npu / op-plugin documentation says each kernel computes (argument by argument),
strictly: an argument outside the documented contract raises, so a wrong translation in
``ascend_patch.ops`` fails loudly instead of being silently accepted. Tests inject them
into a backend's kernel table with ``backend.kernels.override(...)``.

``reference_fused_adam`` / ``reference_fused_sgd`` implement torch's fused optimizer ops
(``torch._fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``: the schema and the update that
``torch.optim.Adam/AdamW/SGD(fused=True)`` document and call), which torch_npu registers
for npu tensors; the npu kernel table carries them under those names.

The MoE token permutation kernels are in :mod:`npu_references_moe`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "CallLog",
    "reference_fused_adam",
    "reference_fused_adamw",
    "reference_fused_sgd",
    "reference_npu_fusion_attention",
    "reference_npu_fusion_attention_grad",
    "reference_npu_grouped_matmul",
    "reference_npu_rms_norm",
    "reference_npu_rotary_mul",
    "reference_npu_scaled_masked_softmax",
    "reference_npu_swiglu",
]

INF_TOKENS = 2147483647


class CallLog:
    """Wraps a reference kernel and records the keyword arguments of each call."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[dict] = []

    def __call__(self, *args, **kwargs):
        self.calls.append({"args": args, **kwargs})
        return self.fn(*args, **kwargs)


def _to_bnsd(x: Tensor, layout: str, n: int) -> Tensor:
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    if layout == "BNSD":
        return x
    if layout == "BSH":
        b, s, h = x.shape
        return x.view(b, s, n, h // n).permute(0, 2, 1, 3)
    if layout == "SBH":
        s, b, h = x.shape
        return x.view(s, b, n, h // n).permute(1, 2, 0, 3)
    raise ValueError(f"layout {layout} is not one of BSH, SBH, BSND, BNSD, TND")


def _from_bnsd(x: Tensor, layout: str) -> Tensor:
    if layout == "BSND":
        return x.permute(0, 2, 1, 3).contiguous()
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSH":
        b, n, s, d = x.shape
        return x.permute(0, 2, 1, 3).reshape(b, s, n * d)
    b, n, s, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)


def _is_compressed_causal(mask: Tensor) -> bool:
    return (mask.dtype == torch.bool and tuple(mask.shape) == (2048, 2048)
            and bool(torch.equal(mask, torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=mask.device), 1))))


def _masked(sq: int, sk: int, atten_mask: Tensor | None, sparse_mode: int, pre: int, nxt: int,
            device: torch.device) -> Tensor | None:
    """Documented masking: True = the (query, key) pair does not take part."""
    if atten_mask is None:
        return None  # "atten_mask None: sparse_mode, pre/next_tockens do not apply; full computation"
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    if sparse_mode in (2, 3, 4):
        if not _is_compressed_causal(atten_mask):
            raise ValueError(f"sparse_mode {sparse_mode} takes the compressed 2048x2048 triu(1) bool mask, got "
                             f"{tuple(atten_mask.shape)} {atten_mask.dtype}")
    if sparse_mode == 2:  # leftUpCausal
        return j > i
    if sparse_mode == 3:  # rightDownCausal
        return j > i + (sk - sq)
    if sparse_mode == 4:  # band, origin at the bottom-right corner
        diag = i + (sk - sq)
        return (j > diag + nxt) | (j < diag - pre)
    if sparse_mode in (0, 1):
        m = atten_mask.bool()
        if sparse_mode == 0:  # band relative to the top-left corner must agree with the mask
            m = m | (j > i + nxt) | (j < i - pre)
        return m
    raise ValueError(f"sparse_mode {sparse_mode} is not covered by this reference")


def _attend(q: Tensor, k: Tensor, v: Tensor, masked: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """q (b, n, sq, d), k/v (b, nk, sk, d) -> out, softmax max/sum (b, n, sq) over the scaled scores."""
    n, nk = q.shape[1], k.shape[1]
    if n % nk:
        raise ValueError(f"query heads {n} must be a multiple of key heads {nk}")
    k = k.repeat_interleave(n // nk, dim=1)
    v = v.repeat_interleave(n // nk, dim=1)
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    smax = scores.amax(-1, keepdim=True)
    safe = torch.where(torch.isfinite(smax), smax, torch.zeros_like(smax))
    e = torch.exp(scores - safe)
    ssum = e.sum(-1, keepdim=True)
    probs = torch.where(ssum > 0, e / ssum.clamp_min(1e-300), torch.zeros_like(e))  # invalid rows: zeros
    out = torch.matmul(probs, v.double())
    return out, smax.squeeze(-1), ssum.squeeze(-1)


def reference_npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                                   atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=INF_TOKENS,
                                   next_tockens=INF_TOKENS, inner_precise=0, prefix=None, actual_seq_qlen=None,
                                   actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
    """REFERENCE npu_fusion_attention: (out, softmax_max, softmax_sum, reserved, seed, offset, numels)."""
    if pse is not None or padding_mask is not None or prefix is not None:
        raise ValueError("this reference covers pse=None, padding_mask=None, prefix=None")
    if keep_prob != 1.0:
        raise ValueError("this reference computes keep_prob=1 only (dropout masks are device-random)")
    if not isinstance(head_num, int) or head_num < 1 or head_num > 256:
        raise ValueError(f"head_num must be an int in [1, 256], got {head_num!r}")
    if input_layout == "TND":
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError("TND needs actual_seq_qlen and actual_seq_kvlen")
        if not all(isinstance(x, int) for x in list(actual_seq_qlen) + list(actual_seq_kvlen)):
            raise ValueError("actual_seq_qlen / actual_seq_kvlen are lists of Python ints")
        if len(actual_seq_qlen) != len(actual_seq_kvlen):
            raise ValueError("actual_seq_qlen and actual_seq_kvlen have different batch sizes")
        if atten_mask is not None and sparse_mode not in (2, 3, 4):
            raise ValueError("TND accepts only an SS mask; this reference covers sparse modes 2, 3, 4")
        if query.shape[1] != head_num:
            raise ValueError(f"head_num {head_num} != query heads {query.shape[1]}")
        if actual_seq_qlen[-1] != query.shape[0] or actual_seq_kvlen[-1] != key.shape[0]:
            raise ValueError("the last cumulative length must be the token count (no leading 0, cumulative)")
        outs = []
        q_prev = k_prev = 0
        for qe, ke in zip(actual_seq_qlen, actual_seq_kvlen):
            qi = query[q_prev:qe].permute(1, 0, 2).unsqueeze(0)
            ki = key[k_prev:ke].permute(1, 0, 2).unsqueeze(0)
            vi = value[k_prev:ke].permute(1, 0, 2).unsqueeze(0)
            masked = _masked(qi.shape[2], ki.shape[2], atten_mask, sparse_mode, pre_tockens, next_tockens,
                             query.device)
            out, _, _ = _attend(qi, ki, vi, masked, scale)
            outs.append(out[0].permute(1, 0, 2))
            q_prev, k_prev = qe, ke
        out = torch.cat(outs, 0).to(query.dtype)
        empty = torch.zeros(0, device=query.device)
        return out, empty, empty, empty, 0, 0, 0
    q = _to_bnsd(query, input_layout, head_num)
    if q.shape[1] != head_num:
        raise ValueError(f"head_num {head_num} != query heads {q.shape[1]}")
    nk = head_num if input_layout in ("BSND", "BNSD") else None
    k = _to_bnsd(key, input_layout, nk or key.shape[-1] // q.shape[-1])
    v = _to_bnsd(value, input_layout, nk or value.shape[-1] // q.shape[-1])
    masked = _masked(q.shape[2], k.shape[2], atten_mask, sparse_mode, pre_tockens, next_tockens, query.device)
    out, smax, ssum = _attend(q, k, v, masked, scale)
    rep = lambda t: t.float().unsqueeze(-1).expand(*t.shape, 8).contiguous()  # noqa: E731  (b, n, s, 8)
    return _from_bnsd(out.to(query.dtype), input_layout), rep(smax), rep(ssum), torch.zeros(0), 0, 0, 0


def reference_npu_rms_norm(x, gamma, epsilon=1e-6):
    """REFERENCE npu_rms_norm: (x * rsqrt(mean(x^2) + eps) * gamma, rstd); gamma must match x's dtype."""
    if gamma.dtype != x.dtype:
        raise TypeError(f"npu_rms_norm: gamma dtype {gamma.dtype} must match x dtype {x.dtype}")
    if not 2 <= x.dim() <= 8:
        raise ValueError(f"npu_rms_norm takes 2-8 dims, got {x.dim()}")
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + epsilon)
    return (x64 * rstd * gamma.double()).to(x.dtype), rstd.float()


def reference_npu_rotary_mul(input, r1, r2, rotary_mode="half"):
    """REFERENCE npu_rotary_mul: r1 * x + r2 * rotate(x), half or interleave; 4-D, D even and < 896."""
    if input.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        raise ValueError("npu_rotary_mul takes 4-D input, r1, r2")
    if input.shape[-1] % 2 or input.shape[-1] >= 896:
        raise ValueError(f"npu_rotary_mul: D must be even and < 896, got {input.shape[-1]}")
    if r1.dtype != input.dtype or r2.dtype != input.dtype:
        raise TypeError("npu_rotary_mul: r1/r2 dtype must match the input")
    x = input.double()
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, -1)
        rot = torch.cat((-x2, x1), -1)
    elif rotary_mode == "interleave":
        x1, x2 = x[..., ::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), -1).flatten(-2)
    else:
        raise ValueError(f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return (r1.double() * x + r2.double() * rot).to(input.dtype)


def reference_npu_swiglu(x, dim=-1):
    """REFERENCE npu_swiglu: silu(first half) * second half along ``dim``."""
    a, b = x.double().chunk(2, dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)


def reference_npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False):
    """REFERENCE npu_scaled_masked_softmax: softmax(x * scale) with mask True = masked; last dims 32..4096 / 32."""
    if fixed_triu_mask:
        raise ValueError("fixed_triu_mask is reserved and only False is supported")
    if mask is None or mask.dtype != torch.bool:
        raise TypeError("npu_scaled_masked_softmax needs a bool mask")
    for n in x.shape[-2:]:
        if not (32 <= n <= 4096 and n % 32 == 0):
            raise ValueError(f"npu_scaled_masked_softmax: last two dims must be in [32, 4096] and multiples of 32, "
                             f"got {tuple(x.shape[-2:])}")
    torch.broadcast_shapes(mask.shape, x.shape)
    y = (x.double() * scale).masked_fill(mask, -10000.0)
    return torch.softmax(y, -1).to(x.dtype)


def _is_transposed(t: Tensor) -> bool:
    """A 2-D tensor the documentation calls transposed: [M, K] with strides [1, M]."""
    return t.dim() == 2 and t.stride(0) == 1 and t.stride(1) == t.shape[0] and not t.is_contiguous()


def reference_npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                                 antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                                 activation_quant_scale=None, activation_quant_offset=None, split_item=0,
                                 group_type=None, group_list_type=0, act_type=0, output_dtype=None,
                                 tuning_config=None):
    """REFERENCE npu_grouped_matmul, non-quantized, ``group_list`` an int64 tensor, single-tensor output.

    The documented (Atlas A2/A3) cases this implements, y_i = x_i @ weight_i:
    group_type 0 (M axis): x one 2-D [M, K] tensor (not transposed), weight one 3-D [E, K, N]
    tensor or E 2-D [K, N] tensors (transposed or not, all alike; float16/bfloat16 only, at most
    128 with group_list_type 1); y one [M, N] tensor.
    group_type 2 (K axis): x one 2-D [K, M] tensor that must be transposed, weight one 2-D
    [M, N] tensor that must not be; y one [E, K, N] tensor. group_list_type 0: cumulative
    sizes; 1: sizes. split_item 2 or 3 (one output tensor). Anything else raises.
    """
    quant = (scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
             activation_quant_scale, activation_quant_offset, tuning_config)
    if bias is not None or any(q is not None for q in quant) or act_type != 0:
        raise ValueError("reference: only the non-quantized grouped matmul without bias or activation is implemented")
    if not isinstance(x, list) or not isinstance(weight, list):
        raise TypeError("npu_grouped_matmul takes x and weight as lists of tensors")
    if split_item not in (2, 3):
        raise ValueError(f"split_item {split_item}: the single-tensor output needs 2 or 3")
    if not isinstance(group_list, Tensor) or group_list.dtype != torch.int64 or group_list.dim() != 1:
        raise TypeError("group_list must be a 1-D int64 tensor here")
    if group_list.device != x[0].device:
        raise ValueError("group_list must be on the device of x")
    if group_list_type == 0:
        ends = group_list.tolist()
        if any(b < a for a, b in zip([0] + ends, ends)):
            raise ValueError("group_list_type 0 needs a non-decreasing cumulative list")
        sizes = [b - a for a, b in zip([0] + ends, ends)]
    elif group_list_type == 1:
        sizes = group_list.tolist()
        if any(v < 0 for v in sizes):
            raise ValueError("group_list_type 1 needs non-negative sizes")
    else:
        raise ValueError(f"group_list_type {group_list_type} is for int8 inputs only")
    if len(sizes) > 1024:
        raise ValueError("at most 1024 groups")
    dtypes = {t.dtype for t in x + weight}
    if len(dtypes) != 1 or dtypes.pop() not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x and weight must share one of float16/bfloat16/float32, got {[t.dtype for t in x + weight]}")
    if output_dtype not in (None, x[0].dtype):
        raise TypeError("output_dtype must be None or x's dtype in the non-quantized case")
    if len(x) != 1:
        raise ValueError("reference: x must be one tensor")
    a = x[0]
    for t in (a, *weight):  # the inner-axis limit: the last dim as stored (the M axis of a transposed x)
        stored_last = t.shape[-2] if t.dim() >= 2 and _is_transposed(t) else t.shape[-1]
        if stored_last >= 65536:
            raise ValueError(f"inner axis {stored_last} is not below the limit 65536")
    if group_type == 0:
        if a.dim() != 2 or not a.is_contiguous():
            raise ValueError("group_type 0: x must be one 2-D tensor, not transposed")
        if len(weight) == 1 and weight[0].dim() == 3:
            mats = list(weight[0].unbind(0))
        elif all(w.dim() == 2 for w in weight):
            mats = weight
            if len({_is_transposed(w) for w in weight}) != 1:
                raise ValueError("the weights must all be transposed or all not")
            if a.dtype == torch.float32:
                raise TypeError("float32 needs x, weight and y as single tensors (one 3-D weight)")
            if group_list_type == 1 and len(weight) > 128:
                raise ValueError("at most 128 weights in a list with group_list_type 1")
        else:
            raise ValueError("group_type 0: weight must be one 3-D tensor or a list of 2-D tensors")
        if len(mats) != len(sizes) or sum(sizes) != a.shape[0]:
            raise ValueError(f"group_list {sizes} does not match {len(mats)} weights and {a.shape[0]} rows")
        if len({w.shape[1] for w in mats}) != 1:
            raise ValueError("every weight must have the same N")
        out, start = [], 0
        for w, n in zip(mats, sizes):
            out.append(a[start:start + n].double() @ w.double())
            start += n
        return [torch.cat(out).to(a.dtype)]
    if group_type == 2:
        if len(weight) != 1 or a.dim() != 2 or weight[0].dim() != 2:
            raise ValueError("group_type 2: x and weight must be one 2-D tensor each")
        if not _is_transposed(a):
            raise ValueError("group_type 2: x must be transposed")
        if not weight[0].is_contiguous():
            raise ValueError("group_type 2: weight must not be transposed")
        b = weight[0]
        if sum(sizes) != a.shape[1] or b.shape[0] != a.shape[1]:
            raise ValueError(f"group_type 2: group_list {sizes} must sum to x's second dim {a.shape[1]}")
        out, start = [], 0
        for n in sizes:
            out.append(a[:, start:start + n].double() @ b[start:start + n].double())
            start += n
        return [torch.stack(out).to(a.dtype)]
    raise ValueError(f"group_type {group_type}: Atlas A2/A3 take -1, 0 or 2 (and -1 is the multi-tensor case)")


def _same_group(name: str, *lists) -> None:
    first = lists[0]
    if not first or any(len(ts) != len(first) for ts in lists):
        raise ValueError(f"{name}: the tensor lists must be non-empty and of one length, got {[len(t) for t in lists]}")
    for ts in zip(*lists):
        if len({t.dtype for t in ts}) != 1 or len({t.device for t in ts}) != 1:
            raise TypeError(f"{name}: a param, its grad and its states must share dtype and device, got "
                            f"{[(t.dtype, str(t.device)) for t in ts]}")


def _unscaled(name, grads, grad_scale, found_inf):
    """Documented for the fused optimizers: grads are divided by grad_scale; a set found_inf skips the step."""
    for t, what in ((grad_scale, "grad_scale"), (found_inf, "found_inf")):
        if t is not None and (not torch.is_tensor(t) or t.numel() != 1):
            raise TypeError(f"{name}: {what} must be a one-element tensor or None")
    if found_inf is not None and float(found_inf) != 0.0:
        return None
    if grad_scale is None:
        return [g.double() for g in grads]
    with torch.no_grad():  # torch's kernels write the unscaled gradients back
        for g in grads:
            g.div_(grad_scale.to(g.dtype))
    return [g.double() for g in grads]


def _reference_adam(decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                    beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    name = "_fused_adamw_" if decoupled else "_fused_adam_"
    if amsgrad:
        raise ValueError(f"{name}: this reference covers amsgrad=False (max_exp_avg_sqs must then be empty)")
    if list(max_exp_avg_sqs):
        raise ValueError(f"{name}: max_exp_avg_sqs must be empty when amsgrad=False")
    _same_group(name, params, grads, exp_avgs, exp_avg_sqs)
    if len(state_steps) != len(params) or not all(torch.is_tensor(s) and s.numel() == 1 for s in state_steps):
        raise TypeError(f"{name}: state_steps is one 1-element tensor per param (already incremented by the caller)")
    lr = float(lr)
    gs = _unscaled(name, grads, grad_scale, found_inf)
    if gs is None:
        return
    for p, g, m, v, s in zip(params, gs, exp_avgs, exp_avg_sqs, state_steps):
        step = float(s)
        if step < 1:
            raise ValueError(f"{name}: the step count must be >= 1 when the kernel runs, got {step}")
        w = p.double()
        if maximize:
            g = -g
        if decoupled:
            w = w * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * w
        m64 = m.double() * beta1 + (1 - beta1) * g
        v64 = v.double() * beta2 + (1 - beta2) * g * g
        bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
        w = w - (lr / bc1) * m64 / (v64.sqrt() / math.sqrt(bc2) + eps)
        with torch.no_grad():
            p.copy_(w)
            m.copy_(m64)
            v.copy_(v64)


def reference_fused_adam(*args, **kwargs):
    """REFERENCE torch._fused_adam_: Adam with L2 decay (decay added to the gradient), always bias-corrected."""
    _reference_adam(False, *args, **kwargs)


def reference_fused_adamw(*args, **kwargs):
    """REFERENCE torch._fused_adamw_: decoupled decay (param *= 1 - lr * weight_decay), always bias-corrected."""
    _reference_adam(True, *args, **kwargs)


def reference_fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
                        maximize, is_first_step, grad_scale=None, found_inf=None):
    """REFERENCE torch._fused_sgd_: decay before momentum; the first step's buffer is the gradient itself."""
    name = "_fused_sgd_"
    if momentum:
        _same_group(name, params, grads, momentum_buffer_list)
    else:
        if list(momentum_buffer_list):
            raise ValueError(f"{name}: momentum_buffer_list must be empty when momentum=0")
        _same_group(name, params, grads)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError(f"{name}: nesterov needs momentum > 0 and dampening 0")
    gs = _unscaled(name, grads, grad_scale, found_inf)
    if gs is None:
        return
    bufs = list(momentum_buffer_list) if momentum else [None] * len(params)
    for p, g, buf in zip(params, gs, bufs):
        w = p.double()
        if maximize:
            g = -g
        if weight_decay:
            g = g + weight_decay * w
        if momentum:
            b = g.clone() if is_first_step else momentum * buf.double() + (1 - dampening) * g
            with torch.no_grad():
                buf.copy_(b)
            g = g + momentum * b if nesterov else b
        with torch.no_grad():
            p.copy_(w - float(lr) * g)


def reference_npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                                        atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                        attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=INF_TOKENS,
                                        next_tockens=INF_TOKENS, inner_precise=0, seed=0, offset=0, numels=0,
                                        prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                                        gen_mask_parallel=True, sync=False):
    """REFERENCE npu_fusion_attention_grad: (dq, dk, dv, dpse) from the forward's softmax statistics.

    The probabilities are recomputed as exp(scale * QK^T - softmax_max) / softmax_sum (the forward's
    (b, n, sq, 8) statistics, value repeated on the last dim), and the softmax backward uses
    attention_in (the forward output): dS = P * (dY V^T - rowsum(dY * attention_in)).
    """
    if pse is not None or padding_mask is not None or prefix is not None or softmax_in is not None:
        raise ValueError("this reference covers pse/padding_mask/prefix/softmax_in = None")
    if keep_prob != 1.0:
        raise ValueError("this reference computes keep_prob=1 only (dropout masks are device-random)")
    if input_layout not in ("BSND", "BNSD"):
        raise ValueError(f"this reference covers BSND and BNSD, got {input_layout}")
    if softmax_max is None or softmax_sum is None or attention_in is None:
        raise ValueError("the backward needs softmax_max, softmax_sum and attention_in from the forward")
    q, k, v = (_to_bnsd(t, input_layout, head_num) for t in (query, key, value))
    g = _to_bnsd(dy, input_layout, head_num).double()
    o = _to_bnsd(attention_in, input_layout, head_num).double()
    b, n, sq, _ = q.shape
    for name, stat in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum)):
        if tuple(stat.shape) != (b, n, sq, 8):
            raise ValueError(f"{name} must be (b, n, sq, 8) = {(b, n, sq, 8)}, got {tuple(stat.shape)}")
    nk = k.shape[1]
    if n % nk:
        raise ValueError(f"query heads {n} must be a multiple of key heads {nk}")
    kk, vv = k.repeat_interleave(n // nk, 1).double(), v.repeat_interleave(n // nk, 1).double()
    scores = torch.matmul(q.double(), kk.transpose(-1, -2)) * scale_value
    masked = _masked(sq, k.shape[2], atten_mask, sparse_mode, pre_tockens, next_tockens, query.device)
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    p = torch.exp(scores - softmax_max[..., :1].double()) / softmax_sum[..., :1].double()
    dv = torch.matmul(p.transpose(-1, -2), g)
    dp = torch.matmul(g, vv.transpose(-1, -2))
    ds = p * (dp - (g * o).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kk) * scale_value
    dk = torch.matmul(ds.transpose(-1, -2), q.double()) * scale_value
    fold = lambda t: t.view(b, nk, n // nk, *t.shape[2:]).sum(2)  # noqa: E731  (GQA: sum the query heads of a group)
    return (_from_bnsd(dq.to(query.dtype), input_layout), _from_bnsd(fold(dk).to(key.dtype), input_layout),
            _from_bnsd(fold(dv).to(value.dtype), input_layout), torch.zeros(0))
