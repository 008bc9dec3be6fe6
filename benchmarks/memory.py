"""What ``ascend-patch check --memory`` costs: wall time, CPU time and peak RSS of whole estimates, in one run.

Two launches at real sizes, each estimated by the command itself in a child process (the command runs
the estimate in a grandchild; the peak RSS is the largest of the two, from ``wait4()``):

* Qwen3-8B on 64 ranks: 8 nodes x 8, TP4 x PP2 x DP8, sequence parallelism, the distributed
  optimizer, bf16, sequence 4096, micro-batch 1, global batch 64 (two roles: the two pipeline stages);
* Qwen3-30B-A3B on 16 ranks with EP8: MindSpeed-LLM v26.1.0's own pretraining layout for it
  (``examples/mcore/qwen3_moe/pretrain_qwen3_30b_a3b_4K_ptd.sh``: 2 nodes x 8, TP1 x PP2 x EP8, the
  distributed optimizer, full recomputation, micro-batch 1, global batch 256, sequence 4096) with
  megatron-core's alltoall dispatcher and grouped GEMM (two roles).

The models come from their Hugging Face config.json (written here; the figures are the published ones), the
launch from ``--hf-config`` with the layout flags, as a user would run it. Goals: <= 60 s wall and <= 2 GB
peak RSS each. ``--layouts`` also estimates Qwen3-8B at the single-node layouts of docs/memory.md's worked
example (not timed against the goal).

    PYTHONPATH=. python benchmarks/memory.py [--megatron-lm DIR] [--chip 910B3] [--cases qwen3-8b,qwen3-30b-a3b]
                                             [--layouts]

Without ``--megatron-lm``, the vendored core_v0.16.1 snapshot (shared/vendor above the repository) is
unpacked into a temporary directory, deleted at the end with everything else.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 36, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 40960,
            "hidden_act": "silu"}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
                 "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16", "max_position_embeddings": 40960, "router_aux_loss_coef": 0.001,
                 "hidden_act": "silu"}

# name -> (config, check's world and layout flags, --megatron-args)
CASES = {
    "qwen3-8b": (QWEN3_8B, ["--nnodes", "8", "--nproc-per-node", "8", "--tp", "4", "--pp", "2", "--sequence-parallel"],
                 "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64"),
    "qwen3-30b-a3b": (QWEN3_30B_A3B, ["--nnodes", "2", "--nproc-per-node", "8", "--tp", "1", "--pp", "2", "--ep", "8"],
                      "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 256 --moe-grouped-gemm "
                      "--moe-token-dispatcher-type alltoall --recompute-granularity full --recompute-method uniform "
                      "--recompute-num-layers 1"),
}
# the worked example's single-node layouts of Qwen3-8B (8 ranks), and the 64-rank one above
LAYOUTS = {
    "TP1 DP8": ["--tp", "1"],
    "TP2 DP4": ["--tp", "2", "--sequence-parallel"],
    "TP4 DP2": ["--tp", "4", "--sequence-parallel"],
    "TP2 PP2 DP2": ["--tp", "2", "--pp", "2", "--sequence-parallel"],
    "TP8": ["--tp", "8", "--sequence-parallel"],
}


def _megatron_lm(into: str) -> str:
    for parent in REPO.parents:
        tarball = parent / "shared" / "vendor" / "megatron-lm-core_v0.16.1.tar.gz"
        if tarball.is_file():
            with tarfile.open(tarball) as tar:
                tar.extractall(into, filter="data")
            return os.path.dirname(sorted(glob.glob(os.path.join(into, "*", "pretrain_gpt.py")))[0])
    sys.exit("no --megatron-lm and no shared/vendor/megatron-lm-core_v0.16.1.tar.gz above the repository")


def _run(argv: list[str]) -> dict:
    """Run ``ascend-patch ARGV`` in a child: its output and exit status, wall and CPU seconds, and the peak RSS
    from ``wait4()`` (the largest of the child and its waited-for children: the estimating process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "ascend_patch.cli", *argv], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"out": out.read(), "err": err.read(), "code": child.returncode, "wall": wall,
                "cpu": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", help="a Megatron-LM checkout (default: the vendored core_v0.16.1)")
    parser.add_argument("--chip", default="910B3")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--layouts", action="store_true", help="also the worked example's Qwen3-8B layouts")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        mlm = ns.megatron_lm or _megatron_lm(tmp)
        rows = []
        for name in ns.cases.split(","):
            config, layout, extra = CASES[name]
            folder = os.path.join(tmp, name)
            os.makedirs(folder)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(config, f)
            argv = ["check", "--memory", "--hf-config", folder, "--megatron-lm", mlm, *layout, "--seq-length", "4096",
                    "--megatron-args", extra, "--chip", ns.chip, "--no-remedies", "--format", "json"]
            print(f"$ ascend-patch {' '.join(repr(a) if ' ' in a else a for a in argv)}", flush=True)
            run = _run(argv)
            if run["code"] not in (0, 1):
                print(run["out"][-3000:], run["err"][-3000:])
                return 1
            doc = json.loads(run["out"])
            rows.append((name, run, doc))
            print(f"{name}: {run['wall']:.1f} s wall, {run['cpu']:.1f} s CPU (user+sys), peak RSS "
                  f"{run['rss_mib']:.0f} MiB; "
                  f"fits {doc['fits']}", flush=True)
            for role in doc["ranks"]:
                print(f"  {role['role']:<26} {len(role['ranks']):>3} ranks  total {role['total_bytes'] / 2**30:6.2f} GiB"
                      f"  (activations {role['activations_bytes'] / 2**30:.2f} GiB)")
        if ns.layouts:
            folder = os.path.join(tmp, "qwen3-8b-layouts")
            os.makedirs(folder)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(QWEN3_8B, f)
            print(f"\nQwen3-8B on one node of 8 x {ns.chip}, sequence 4096, micro-batch 1, bf16, distributed optimizer:")
            for label, layout in LAYOUTS.items():
                argv = ["check", "--memory", "--hf-config", folder, "--megatron-lm", mlm, "--nnodes", "1",
                        "--nproc-per-node", "8", *layout, "--seq-length", "4096", "--megatron-args",
                        "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64", "--chip", ns.chip,
                        "--no-remedies", "--format", "json"]
                run = _run(argv)
                doc = json.loads(run["out"]) if run["out"].strip().startswith("{") else {"ranks": [], "fits": False}
                worst = max((r["total_bytes"] for r in doc["ranks"]), default=0)
                print(f"  {label:<12} worst rank {worst / 2**30:6.2f} GiB  fits {doc['fits']}  ({run['wall']:.0f} s)",
                      flush=True)
        goal = all(run["wall"] <= 60 and run["rss_mib"] <= 2048 for _, run, _ in rows)
        print(f"\ngoals (<= 60 s wall, <= 2048 MiB peak RSS each): {'met' if goal else 'NOT met'}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
