"""Textbook optimizers written from their definitions (float64), the references of the optimizer tests."""

from __future__ import annotations

import torch

__all__ = ["textbook_adam", "textbook_sgd"]


def textbook_adam(params, grads, *, lr, betas, eps, wd, decoupled, bias_correction=True, store=None):
    """Adam (L2 decay) / AdamW (decoupled decay) in float64; ``store`` rounds the params after each step."""
    b1, b2 = betas
    p = [t.double().clone() for t in params]
    m = [torch.zeros_like(t) for t in p]
    v = [torch.zeros_like(t) for t in p]
    for step, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            g = g.double()
            if not decoupled and wd:
                g = g + wd * p[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mh = m[i] / (1 - b1 ** step) if bias_correction else m[i]
            vh = v[i] / (1 - b2 ** step) if bias_correction else v[i]
            update = mh / (vh.sqrt() + eps)
            if decoupled and wd:
                update = update + wd * p[i]
            p[i] = p[i] - lr * update
            if store is not None:
                p[i] = p[i].to(store).double()
    return p, m, v


def textbook_sgd(params, grads, *, lr, momentum, dampening, wd, nesterov, wd_after_momentum=False):
    p = [t.double().clone() for t in params]
    buf = [None] * len(p)
    for gs in grads:
        for i, g in enumerate(gs):
            d = g.double()
            if wd and not wd_after_momentum:
                d = d + wd * p[i]
            if momentum:
                buf[i] = d.clone() if buf[i] is None else momentum * buf[i] + (1 - dampening) * d
                d = d + momentum * buf[i] if nesterov else buf[i]
            if wd and wd_after_momentum:
                d = d + wd * p[i]
            p[i] = p[i] - lr * d
    return p
