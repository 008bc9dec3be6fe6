"""Adapted fused ops against the naive path a user would otherwise have, measured side by side on cpu.

    PYTHONPATH=. python benchmarks/ops.py [--repeats 7] [--threads N]

Each row times the adaptor and its baseline alternately (warm-up first), keeps the best of
``--repeats`` rounds for each (the machine is shared: interference only adds time) and prints
baseline / adaptor (> 1.0 means the adaptor is faster). Both sides compute the same thing;
the script checks that before timing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ascend_patch.adaptors.megatron import fusions
from ascend_patch.ops import attention, grouped_gemm, multi_tensor, norm, norm_apex, optim, rope, softmax


def timed(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def compare(name: str, adaptor: Callable[[], object], baseline: Callable[[], object], repeats: int,
            inner: int = 3) -> float:
    adaptor(), baseline()  # warm-up (allocations, lazy init)
    a_times, b_times = [], []
    for i in range(repeats):  # which side goes first alternates: neither inherits the other's warm caches
        if i % 2:
            b_times.append(timed(baseline, inner))
            a_times.append(timed(adaptor, inner))
        else:
            a_times.append(timed(adaptor, inner))
            b_times.append(timed(baseline, inner))
    a, b = min(a_times), min(b_times)
    ratio = b / a
    print(f"{name:<84} {b * 1e3:>10.2f} {a * 1e3:>10.2f} {ratio:>7.2f}x", flush=True)
    return ratio


def close(x: torch.Tensor, y: torch.Tensor, tol: float, what: str) -> None:
    err = (x.double() - y.double()).abs().max().item()
    if not err <= tol:
        raise SystemExit(f"{what}: adaptor and baseline differ by {err} (> {tol}); refusing to time them")


# -- the rows -------------------------------------------------------------------------------

def adam_rows(repeats: int) -> list[float]:
    torch.manual_seed(0)
    shapes = [(1024, 1024)] * 8 + [(1024,)] * 8 + [(4096, 256)] * 4

    def make(cls: type, **kw: object) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-2
        return cls(ps, lr=1e-3, weight_decay=0.01, **kw), ps

    fused, pf = make(optim.ApexFusedAdam)
    naive, pn = make(torch.optim.AdamW, foreach=False)
    fused.step(), naive.step()
    close(pf[0], pn[0], 1e-6, "FusedAdam")
    out = [compare("apex FusedAdam vs torch AdamW(foreach=False), 12.6M params", fused.step, naive.step, repeats)]
    te, _ = make(optim.TEFusedAdam)
    naive_l2, _ = make(torch.optim.Adam, foreach=False)
    out.append(compare("TE FusedAdam vs torch Adam(foreach=False)", te.step, naive_l2.step, repeats))
    sgd, _ = make(optim.ApexFusedSGD, momentum=0.9)
    naive_sgd, _ = make(torch.optim.SGD, momentum=0.9, foreach=False)
    out.append(compare("apex FusedSGD vs torch SGD(momentum, foreach=False)", sgd.step, naive_sgd.step, repeats))
    return out


def multi_tensor_rows(repeats: int) -> list[float]:
    from megatron.core.utils import local_multi_tensor_l2_norm, local_multi_tensor_scale

    torch.manual_seed(0)
    grads = [torch.randn(512, 512) for _ in range(24)] + [torch.randn(512) for _ in range(24)]
    noop = torch.zeros(1, dtype=torch.int)
    ours = multi_tensor.multi_tensor_applier(multi_tensor.multi_tensor_l2norm, noop, [grads], False)[0]
    theirs = local_multi_tensor_l2_norm(2048 * 32, noop, [grads], False)[0]
    close(ours, theirs.cpu(), 1e-2, "l2norm")
    rows = [compare("amp_C.multi_tensor_l2norm vs megatron's local fallback",
                    lambda: multi_tensor.multi_tensor_l2norm(2048 * 32, noop, [grads], False),
                    lambda: local_multi_tensor_l2_norm(2048 * 32, noop, [grads], False), repeats)]
    # multi_tensor_scale as megatron calls it: clip_grads scales the grads in place; the float16
    # optimizer copies fp32 main params into bf16 model params (and back) at scale 1.0
    clipped = [g.clone() for g in grads]
    rows.append(compare("amp_C.multi_tensor_scale in place (clip_grads) vs megatron's local fallback",
                        lambda: multi_tensor.multi_tensor_scale(2048 * 32, noop, [clipped, clipped], 0.999),
                        lambda: local_multi_tensor_scale(2048 * 32, noop, [clipped, clipped], 0.999), repeats))
    model = [torch.empty_like(g, dtype=torch.bfloat16) for g in grads]
    multi_tensor.multi_tensor_scale(2048 * 32, noop, [grads, model], 1.0)
    if not all(torch.equal(m, g.to(torch.bfloat16)) for m, g in zip(model, grads)):
        raise SystemExit("scale: the adaptor's bf16 copy differs from a plain cast; refusing to time it")
    rows.append(compare("amp_C.multi_tensor_scale fp32 main -> bf16 model params vs megatron's local fallback",
                        lambda: multi_tensor.multi_tensor_scale(2048 * 32, noop, [grads, model], 1.0),
                        lambda: local_multi_tensor_scale(2048 * 32, noop, [grads, model], 1.0), repeats))
    main = [torch.empty_like(g) for g in grads]
    rows.append(compare("amp_C.multi_tensor_scale bf16 model -> fp32 main params vs megatron's local fallback",
                        lambda: multi_tensor.multi_tensor_scale(2048 * 32, noop, [model, main], 1.0),
                        lambda: local_multi_tensor_scale(2048 * 32, noop, [model, main], 1.0), repeats))
    return rows


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """What code without flash-attn writes: scores, mask, softmax, weighted sum ((b, s, h, d) layout)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qt, kt.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), vt).transpose(1, 2)


def attention_rows(repeats: int) -> list[float]:
    torch.manual_seed(0)
    rows = []
    for causal in (True, False):
        q, k, v = (torch.randn(1, 1024, 8, 64, requires_grad=True) for _ in range(3))
        g = torch.randn(1, 1024, 8, 64)

        def ours() -> None:
            attention.flash_attn_func(q, k, v, causal=causal).backward(g)

        def naive() -> None:
            explicit_attention(q, k, v, causal).backward(g)

        close(attention.flash_attn_func(q, k, v, causal=causal), explicit_attention(q, k, v, causal), 1e-4,
              "flash_attn_func")
        label = "causal" if causal else "full"
        rows.append(compare(f"flash_attn_func vs explicit attention, seq 1024 {label}, fwd+bwd", ours, naive,
                            repeats, inner=1))
    lens = [300, 200, 500, 24]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    qv, kv, vv = (torch.randn(sum(lens), 8, 64) for _ in range(3))

    def naive_varlen() -> list[torch.Tensor]:
        return [explicit_attention(qv[a:b][None], kv[a:b][None], vv[a:b][None], True)[0]
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]

    rows.append(compare("flash_attn_varlen_func vs per-sequence explicit attention (causal)",
                        lambda: attention.flash_attn_varlen_func(qv, kv, vv, cu, cu, 500, 500, causal=True),
                        naive_varlen, repeats))
    return rows


def rope_rows(repeats: int) -> list[float]:
    from megatron.core.models.common.embeddings import rope_utils

    torch.manual_seed(0)
    x = torch.randn(4, 2048, 16, 128)
    half = torch.outer(torch.arange(4096).float(), 1.0 / 10000 ** (torch.arange(0, 128, 2).float() / 128))
    cos, sin = half.cos(), half.sin()

    def torch_reference() -> torch.Tensor:  # flash-attn's pure-torch apply_rotary_emb_torch
        c = torch.cat((cos[:2048], cos[:2048]), -1)[None, :, None]
        s = torch.cat((sin[:2048], sin[:2048]), -1)[None, :, None]
        return x * c + rope.rotate_half(x) * s

    close(rope.apply_rotary_emb(x, cos, sin), torch_reference(), 1e-5, "apply_rotary_emb")
    rows = [compare("flash_attn apply_rotary_emb vs its pure-torch reference", lambda: rope.apply_rotary_emb(x, cos, sin),
                    torch_reference, repeats)]
    t = torch.randn(2048, 4, 16, 128)
    freqs = torch.cat((half[:2048], half[:2048]), -1)[:, None, None, :]
    close(rope.fused_rope_sbhd(t, freqs), rope_utils._apply_rotary_pos_emb_bshd(t, freqs), 1e-5, "fused rope")
    rows.append(compare("megatron fused RoPE (sbhd) vs megatron's unfused RoPE", lambda: rope.fused_rope_sbhd(t, freqs),
                        lambda: rope_utils._apply_rotary_pos_emb_bshd(t, freqs), repeats))
    return rows


def activation_rows(repeats: int) -> list[float]:
    torch.manual_seed(0)
    x = torch.randn(4096, 2 * 2048, requires_grad=True)
    bias = torch.randn(2 * 2048, requires_grad=True)
    g = torch.randn(4096, 2048)
    impl = fusions.bias_swiglu_impl

    def naive_swiglu() -> torch.Tensor:
        a, b = (x + bias).chunk(2, -1)
        return F.silu(a) * b

    close(impl(x, bias), naive_swiglu(), 1e-5, "bias_swiglu")
    rows = [compare("megatron bias_swiglu_impl vs eager silu(a)*b, fwd+bwd", lambda: impl(x, bias).backward(g),
                    lambda: naive_swiglu().backward(g), repeats)]
    y = torch.randn(4096, 4096, requires_grad=True)
    b2 = torch.randn(4096, requires_grad=True)
    gelu = fusions.bias_gelu_impl

    def naive_gelu() -> torch.Tensor:  # megatron's bias_gelu formula, run eagerly
        z = y + b2
        return z * 0.5 * (1.0 + torch.tanh(0.79788456 * z * (1 + 0.044715 * z * z)))

    close(gelu(y, b2), naive_gelu(), 1e-5, "bias_gelu")
    rows.append(compare("megatron bias_gelu_impl vs its formula run eagerly, fwd+bwd",
                        lambda: gelu(y, b2).backward(g.repeat(1, 2)), lambda: naive_gelu().backward(g.repeat(1, 2)),
                        repeats))
    return rows


def norm_rows(repeats: int) -> list[float]:
    torch.manual_seed(0)
    x = torch.randn(8, 1024, 4096, requires_grad=True)
    g = torch.randn_like(x)
    rms = norm_apex.FusedRMSNorm(4096)

    def manual_rms() -> torch.Tensor:  # apex's own non-CUDA fallback (HF style)
        var = x.float().pow(2).mean(-1, keepdim=True)
        return rms.weight * (x * torch.rsqrt(var + rms.eps))

    close(rms(x), manual_rms(), 1e-5, "FusedRMSNorm")
    rows = [compare("apex FusedRMSNorm vs apex's manual_rms_norm, fwd+bwd", lambda: rms(x).backward(g),
                    lambda: manual_rms().backward(g), repeats)]
    ln, torch_ln = norm_apex.FusedLayerNorm(4096), torch.nn.LayerNorm(4096)
    rows.append(compare("apex FusedLayerNorm vs torch.nn.LayerNorm, fwd+bwd", lambda: ln(x).backward(g),
                        lambda: torch_ln(x).backward(g), repeats))
    w, b = ln.weight, ln.bias
    rows.append(compare("megatron FusedLayerNormAffineFunction vs torch.nn.LayerNorm, fwd+bwd",
                        lambda: norm.FusedLayerNormAffineFunction.apply(x, w, b, (4096,), 1e-5).backward(g),
                        lambda: torch_ln(x).backward(g), repeats))
    return rows


def softmax_rows(repeats: int) -> list[float]:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 1024, 1024).bfloat16()
    tri = torch.ones(1024, 1024, dtype=torch.bool).triu(1)

    def megatron_torch_path() -> torch.Tensor:  # FusedScaleMaskSoftmax.forward_torch_softmax, causal
        y = x.float().masked_fill(tri, -10000.0)
        return torch.softmax(y, dim=-1).bfloat16()

    close(softmax.scaled_masked_softmax(x, None, 1.0, causal=True), megatron_torch_path(), 1e-2, "softmax")
    return [compare("megatron fused causal softmax vs its torch fallback (bf16)",
                    lambda: softmax.scaled_masked_softmax(x, None, 1.0, causal=True), megatron_torch_path, repeats)]


def grouped_gemm_rows(repeats: int) -> list[float]:
    """One expert linear ([out, in] weights, as megatron's experts hold them) over 8 experts, fwd+bwd,
    against SequentialMLP's way: split the tokens, one linear per expert, concatenate."""
    torch.manual_seed(0)
    experts, hidden, ffn = 8, 512, 1024
    rows = []
    for label, sizes in (("balanced", [512] * 8), ("skewed, one empty", [1400, 900, 700, 500, 300, 200, 96, 0])):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(sum(sizes), hidden, dtype=dtype, requires_grad=True)
            w = torch.randn(experts, ffn, hidden, dtype=dtype, requires_grad=True)
            g = torch.randn(sum(sizes), ffn, dtype=dtype)
            per_expert = list(w.unbind(0))

            def sequential() -> torch.Tensor:
                return torch.cat([F.linear(t, we) for t, we in zip(torch.split(x, sizes), per_expert)])

            def grouped() -> torch.Tensor:
                return grouped_gemm.grouped_matmul(x, w, sizes, trans_b=True)

            close(grouped(), sequential(), 1e-3 if dtype == torch.float32 else 0.5, "grouped matmul")
            name = f"grouped GEMM vs SequentialMLP's split/linear/cat, {label}, {str(dtype)[6:]}, fwd+bwd"
            rows.append(compare(name, lambda: grouped().backward(g), lambda: sequential().backward(g), repeats))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--only", default="", help="run the row groups whose name contains this (adam, multi_tensor, "
                        "attention, rope, activation, norm, softmax, grouped_gemm)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import ascend_patch
    from ascend_patch.config import Settings

    # the naive paths of megatron (device="cuda" fallbacks) run as users run them: under ascend_patch
    ascend_patch.apply(Settings(device="cpu"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats} rounds, "
          "cpu target applied")
    print(f"{'op (adaptor vs baseline)':<84} {'base ms':>10} {'ours ms':>10} {'ratio':>8}")
    ratios = []
    for rows in (adam_rows, multi_tensor_rows, attention_rows, rope_rows, activation_rows, norm_rows, softmax_rows,
                 grouped_gemm_rows):
        if args.only in rows.__name__:
            ratios += rows(args.repeats)
    ascend_patch.remove()
    print(f"lowest ratio {min(ratios):.2f}x, geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
