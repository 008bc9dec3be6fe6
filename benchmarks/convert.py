"""Conversion throughput and memory against the physical limit (``cp -r`` of the same files), in one run.

A Qwen3-0.6B-shaped bf16 checkpoint (28 layers, hidden 1024, 16 heads / 8 KV heads of 128,
MLP 3072, vocabulary 151936, tied embeddings: ~0.6 B parameters, ~1.2 GB) and a Qwen3-MoE-shaped
one (16 layers, hidden 512, 64 experts of width 256 per layer, untied: ~0.57 B parameters,
~1.15 GB) are generated as random tensors written straight into safetensors shards (no
transformers model is built). Then, alternating and repeated: ``cp -r`` of each checkpoint,
and ``ascend-patch convert`` hf -> mg (dense: TP1/PP1 and TP2/PP2; MoE: TP1/PP1/EP1 and
TP2/PP2/EP4; both also hf -> torch_dist and torch_dist -> hf, Megatron-LM's
default format, written and read without a model) in a child process whose peak RSS is taken from wait4().
``--models llama,llama-big`` adds Llama-3-shaped checkpoints of 0.87 B and 1.74 B parameters (1.74 and
3.49 GB), so peak RSS shows per model size. Each conversion's 'fsync s' is what it spent making the
output durable before publishing it (from its summary line).
Goals: dense throughput >= 0.5x the copy's and peak RSS <= 25% of the model's size; MoE
throughput >= 0.8x its copy's (best of runs), peak RSS <= 10% of the model and no larger than
the dense model's.

    PYTHONPATH=. python benchmarks/convert.py [--repeats 7] [--keep] [--models dense,moe,llama,llama-big]
                                              [--also=--no-zip-crc ...]
                                              [--case torch_dist->hf,moe] [--baseline /path/to/other/checkout]

``--also=FLAG`` adds, for each model, a TP1/PP1 row converted with that flag, measured in the
same alternating runs, so a setting's cost is a ratio within one run (the CRC-32 fields cost
~1.7x in the streaming phase: compare the default row with ``--also=--no-zip-crc``).

``--case A,B`` keeps only the conversions whose name contains one of the substrings (the copy of
each model they convert is always kept). ``--baseline DIR`` (repeatable) adds, for every conversion, a
row ``NAME [baseline]`` (``NAME [folder]`` with several) run with ``DIR`` (another checkout of ascend_patch, e.g. ``git archive main``
unpacked) first on PYTHONPATH, in the same alternating runs: before / after side by side.

Everything lives in a temporary directory under /tmp, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": True,
    "attention_bias": False, "dtype": "bfloat16",
}
MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512, "intermediate_size": 1536,
    "moe_intermediate_size": 256, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
    "num_hidden_layers": 16, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
    "attention_bias": False, "dtype": "bfloat16",
}
# Llama-3-shaped, the vocabulary and width of Llama-3.2-1B (GQA 32/8 heads of 64, SwiGLU 8192, tied), with
# fewer layers: 10 of them make 0.87 B parameters (1.74 GB), 24 make 1.74 B (3.49 GB); peak RSS per model size
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 10, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "tie_word_embeddings": True,
    "attention_bias": False, "dtype": "bfloat16",
}
MODELS = {"dense": CONFIG, "moe": MOE_CONFIG, "llama": LLAMA_CONFIG,
          "llama-big": {**LLAMA_CONFIG, "num_hidden_layers": 24}}
# run name -> (model, family, TP, PP, EP); "cp -r <model>" runs are the reference for that model
CONVERSIONS = {
    "hf->mg TP1/PP1": ("dense", "qwen3", 1, 1, 1),
    "hf->mg TP2/PP2": ("dense", "qwen3", 2, 2, 1),
    "llama hf->mg TP1/PP1": ("llama", "llama", 1, 1, 1),
    "llama hf->mg TP2/PP2": ("llama", "llama", 2, 2, 1),
    "llama-big hf->mg TP1/PP1": ("llama-big", "llama", 1, 1, 1),
    "llama-big hf->mg TP2/PP2": ("llama-big", "llama", 2, 2, 1),
    "moe hf->mg TP1/PP1/EP1": ("moe", "qwen3_moe", 1, 1, 1),
    "moe hf->mg TP2/PP2/EP4": ("moe", "qwen3_moe", 2, 2, 4),
}
SHARD_BYTES = 400 * 1024 * 1024


def _tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, f, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, ng = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (nh * d, h)),
                (p + "self_attn.k_proj.weight", (ng * d, h)), (p + "self_attn.v_proj.weight", (ng * d, h))]
        if cfg["model_type"].startswith("qwen3"):
            out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
        out += [(p + "self_attn.o_proj.weight", (h, nh * d)), (p + "post_attention_layernorm.weight", (h,))]
        if cfg.get("num_experts"):
            fe = cfg["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (cfg["num_experts"], h)))
            for e in range(cfg["num_experts"]):
                out += [(p + f"mlp.experts.{e}.gate_proj.weight", (fe, h)),
                        (p + f"mlp.experts.{e}.up_proj.weight", (fe, h)),
                        (p + f"mlp.experts.{e}.down_proj.weight", (h, fe))]
        else:
            out += [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                    (p + "mlp.down_proj.weight", (h, f))]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def _model_bytes(cfg: dict) -> int:
    return sum(2 * __import__("math").prod(s) for _, s in _tensors(cfg))


def generate(path: str, model: str = "dense") -> int:
    """Random bf16 tensors written shard by shard (one shard in memory at a time); returns total bytes."""
    import torch
    from safetensors.torch import save_file

    config = MODELS[model]
    os.makedirs(path)
    specs = _tensors(config)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for key, shape in specs:
        n = 2
        for s in shape:
            n *= s
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((key, shape))
        size += n
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {key: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16) for key, shape in shard}
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update({key: name for key in tensors})
        del tensors
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return total


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, files in os.walk(path) for n in files)


def timed(cmd: list[str], env: dict[str, str] | None = None,
          cwd: str | None = None) -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS bytes of the child from wait4, its stdout, its CPU seconds: user + system)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode()[-2000:]}")
        return seconds, usage.ru_maxrss * 1024, out.read().decode(), usage.ru_utime + usage.ru_stime


def _write_phase(stdout: str) -> float | None:
    """The converter's own figure for its streaming phase (its summary line: "... streaming Y s ...")."""
    m = re.search(r"\(prepare [\d.]+ s, streaming ([\d.]+) s", stdout) or re.search(
        r"wrote \d+ file\(s\), [\d.]+ MB in ([\d.]+) s", stdout)  # a baseline from before the summary said more
    return float(m.group(1)) if m else None


def _fsync_phase(stdout: str) -> float | None:
    """The time the converter spent in fsync before publishing (summed over its writer threads)."""
    m = re.search(r", fsync ([\d.]+) s", stdout)
    return float(m.group(1)) if m else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--models", default="dense,moe", help="which checkpoints to measure, comma-separated: dense "
                        "(Qwen3-0.6B-shaped), moe, llama (Llama-3-shaped, 0.87 B), llama-big (the same, 1.74 B)")
    parser.add_argument("--also", action="append", default=[], metavar="FLAG",
                        help="add a TP1/PP1 row per model converted with this extra flag (repeatable), "
                             "e.g. --also=--no-zip-crc")
    parser.add_argument("--case", default="", help="only the conversions whose name contains one of these "
                                                      "comma-separated substrings (e.g. 'torch_dist->hf,moe')")
    parser.add_argument("--baseline", metavar="DIR", action="append", default=[],
                        help="another ascend_patch checkout: each conversion also runs with it first on PYTHONPATH, as "
                        "a row 'NAME [baseline]' (repeatable: then 'NAME [DIR's folder name]' for each)")
    parser.add_argument("--generate-into", help=argparse.SUPPRESS)
    parser.add_argument("--generate-model", default="dense", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_into:
        print(generate(args.generate_into, args.generate_model))
        return 0

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models takes {', '.join(MODELS)}; got {args.models!r}")
    sizes = {m: _model_bytes(MODELS[m]) for m in models}
    free = shutil.disk_usage("/tmp").free
    # the sources, their torch_dist copies, one output and the copy's page-cache slack
    needed = int(2 * sum(sizes.values()) + 2.5 * max(sizes.values()))
    if free < needed:
        print(f"need {needed / 1e9:.1f} GB free in /tmp, have {free / 1e9:.1f} GB", file=sys.stderr)
        return 1
    root = tempfile.mkdtemp(prefix="ascend_patch-bench-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH")}  # as a user runs it
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    try:
        sources = {}
        for model in models:
            src = sources[model] = os.path.join(root, f"hf-{model}")
            t0 = time.perf_counter()
            # In a child: this process must stay small, since a child's peak RSS counts the parent's at fork.
            gen = subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-into", src,
                                  "--generate-model", model], env=env, capture_output=True, text=True)
            if gen.returncode != 0:
                raise SystemExit(f"generating the checkpoint failed: {gen.stderr[-2000:]}")
            total = int(gen.stdout.strip().splitlines()[-1])
            print(f"generated the {model} model: {len(_tensors(MODELS[model]))} tensors, {total / 1e9:.3f} GB bf16 "
                  f"({total / 2 / 1e9:.3f} B parameters) in {time.perf_counter() - t0:.1f} s")
        floor_s, floor_rss, *_ = timed([sys.executable, "-c", "import ascend_patch.cli, ascend_patch.loaders.engine, "
                                    "ascend_patch.loaders.hf, ascend_patch.loaders.megatron, safetensors, tqdm"], env)
        torch_s, torch_rss, *_ = timed([sys.executable, "-c", "import torch"], env)
        plan: dict[str, tuple[str, list[str]]] = {}  # run -> (model, command without --save-dir)
        for model in models:
            plan[f"cp -r {model}"] = (model, ["cp", "-r", sources[model]])
            for name, (m, family, tp, pp, ep) in CONVERSIONS.items():
                if m == model:
                    plan[name] = (model, [
                        sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf",
                        "--save-model-type", "mg", "--model-type-hf", family, "--load-dir", sources[model],
                        "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp),
                        *(["--target-expert-parallel-size", str(ep)] if ep > 1 else []), "--no-progress",
                        "--save-dir"])
                    if (tp, pp, ep) == (1, 1, 1):  # --also=FLAG: the same conversion with a flag, side by side
                        for flag in args.also:
                            plan[f"{name} {flag}"] = (model, [*plan[name][1][:-1], flag, "--save-dir"])
            # Megatron-LM's default format (experts on their own axis for MoE); its source is this converter's output
            dist = os.path.join(root, f"dist-{model}")
            label = "" if model == "dense" else f"{model} "
            timed([sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf",
                   "--save-model-type", "mg", "--ckpt-format", "torch_dist", "--load-dir", sources[model],
                   "--save-dir", dist, "--no-progress"], env)
            plan[f"{label}hf->torch_dist"] = (model, [
                sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "hf", "--save-model-type",
                "mg", "--ckpt-format", "torch_dist", "--load-dir", sources[model], "--no-progress", "--save-dir"])
            plan[f"{label}torch_dist->hf"] = (model, [
                sys.executable, "-m", "ascend_patch.cli", "convert", "--load-model-type", "mg", "--save-model-type",
                "hf", "--load-dir", dist, "--no-progress", "--save-dir"])
        cases = [c.strip() for c in args.case.split(",") if c.strip()]
        if cases:
            kept = {n: v for n, v in plan.items() if not n.startswith("cp -r") and any(c in n for c in cases)}
            if not kept:
                parser.error(f"--case {args.case!r} matches none of: "
                             f"{', '.join(n for n in plan if not n.startswith('cp -r'))}")
            plan = {n: v for n, v in plan.items() if n in kept or (n.startswith("cp -r") and any(
                m == v[0] for m, _ in kept.values()))}
        envs = {name: env for name in plan}
        cwds: dict[str, str | None] = {name: None for name in plan}
        for base in args.baseline:
            label = "[baseline]" if len(args.baseline) == 1 else f"[{os.path.basename(os.path.normpath(base))}]"
            base_env = dict(env, PYTHONPATH=os.path.abspath(base) + os.pathsep + env.get("PYTHONPATH", ""))
            for name in [n for n in plan if not n.startswith("cp -r") and not n.endswith("]")]:
                plan[f"{name} {label}"] = plan[name]
                envs[f"{name} {label}"] = base_env
                cwds[f"{name} {label}"] = os.path.abspath(base)  # `python -m` puts the cwd first
        if args.baseline:
            plan = dict(sorted(plan.items(), key=lambda kv: (kv[1][0], kv[0].split(" [")[0], not kv[0].endswith("]"),
                                                             kv[0])))
        # per run: wall s, peak RSS, bytes written, streaming s, CPU s, fsync s
        runs: dict[str, list[tuple[float, int, int, float | None, float, float | None]]] = {n: [] for n in plan}
        for _ in range(args.repeats):
            for name, (model, cmd) in plan.items():
                dst = os.path.join(root, "out")
                os.sync()  # every run starts with no dirty pages left by the previous one (writeback would throttle it)
                seconds, rss, stdout, cpu = timed([*cmd, dst], envs[name], cwds[name])
                written = _du(dst)
                shutil.rmtree(dst)
                runs[name].append((seconds, rss, written, _write_phase(stdout), cpu, _fsync_phase(stdout)))
        print(f"\ninterpreter floor (python + the converter's imports, no torch): peak RSS {floor_rss / 1e6:.0f} MB, "
              f"{floor_s:.2f} s; for scale, `import torch` alone: {torch_rss / 1e6:.0f} MB, {torch_s:.2f} s")
        w = max(len(n) for n in plan)
        print(f"{'run':<{w}} {'written GB':>10} {'best s':>7} {'x cp':>5} {'median s':>9} {'x cp':>5} "
              f"{'stream s':>9} {'x cp':>5} {'fsync s':>8} {'peak RSS MB':>12} {'RSS/model':>10} {'CPU s':>6}")
        cp: dict[str, tuple[float, float]] = {}
        peak: dict[str, int] = {}
        for name, samples in runs.items():
            model = plan[name][0]
            times = [s for s, *_ in samples]
            best, median = min(times), statistics.median(times)
            rss = max(r for _, r, *_ in samples)
            cpu = statistics.median(sample[4] for sample in samples)
            written = samples[0][2]
            phases = [sample[3] for sample in samples if sample[3] is not None]
            stream = min(phases) if phases else best
            synced = [sample[5] for sample in samples if sample[5] is not None]
            fsync = f"{statistics.median(synced):>8.2f}" if synced else f"{'-':>8}"
            if name.startswith("cp -r"):
                cp[model] = (written / best, written / median)
            elif "torch_dist" not in name and not name.endswith("]"):  # hf -> legacy: what MoE and dense compare on
                peak[model] = max(peak.get(model, 0), rss)
            cp_best, cp_median = cp[model]
            print(f"{name:<{w}} {written / 1e9:>10.3f} {best:>7.2f} {written / best / cp_best:>5.2f} {median:>9.2f} "
                  f"{written / median / cp_median:>5.2f} {stream:>9.2f} {written / stream / cp_best:>5.2f} {fsync} "
                  f"{rss / 1e6:>12.0f} {rss / sizes[model]:>9.1%} {cpu:>6.2f}")
        print("\n'x cp' is throughput (bytes written per second) over the copy's of the same model. 'best' and "
              f"'median' are over the {args.repeats} alternating runs of each (a shared virtual machine only ever slows "
              "a run down, so the best is the least disturbed); end to end includes interpreter start, imports, plugin "
              "discovery and preflight. 'stream s' is the converter's own figure for its streaming phase (best run); "
              "'fsync s' the time it then spent in fsync of the output before publishing it, summed over its writer "
              "threads (median; part of it overlaps the other thread's writing). "
              "'CPU s' is the child's user + system time (median): what a run costs the machine, which other "
              "work on a shared one moves far less than wall time.")
        for model in [m for m in models if m in peak]:
            print(f"{model} model size {sizes[model] / 1e9:.3f} GB; peak RSS of its conversions "
                  f"{peak.get(model, 0) / 1e6:.0f} MB (hf -> mg legacy)")
        print(f"goals: dense >= 0.50x cp throughput and peak RSS <= 25% of its size; MoE >= 0.80x cp (best of runs), "
              "peak RSS <= 10% of its size and <= the dense model's")
        if "dense" in peak and "moe" in peak:
            print(f"MoE peak RSS / dense peak RSS: {peak['moe'] / peak['dense']:.2f}")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
