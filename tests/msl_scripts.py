"""MindSpeed-LLM v26.1.0's Qwen3 example launch scripts (vendored test inputs), with their paths filled in.

``shared/vendor/mindspeed-llm-v26.1.0-qwen3-examples.tar.gz`` holds ``examples/mcore/qwen3`` and
``qwen3_moe`` (``MINDSPEED_LLM_EXAMPLES`` names another copy). The scripts leave their paths as
placeholders ("your data path"); :func:`filled` sets them, as a user does before running one.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

from helpers import REPO

__all__ = ["PLACEHOLDERS", "examples_dir", "filled", "pretrain_scripts", "tune_scripts", "vendor_file"]

TARBALL = "mindspeed-llm-v26.1.0-qwen3-examples.tar.gz"
PLACEHOLDERS = ("CKPT_SAVE_DIR", "DATA_PATH", "TOKENIZER_PATH", "CKPT_LOAD_DIR")


def vendor_file(name: str) -> Path:
    """A file of ``shared/vendor`` above the repository."""
    for parent in Path(REPO).resolve().parents:
        candidate = parent / "shared" / "vendor" / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name} not found in a shared/vendor above {REPO}")


def examples_dir(into: Path) -> Path:
    """The unpacked ``examples/mcore`` (unpacked into ``into`` once)."""
    named = os.environ.get("MINDSPEED_LLM_EXAMPLES")
    tarball = Path(named) if named else vendor_file(TARBALL)
    found = sorted(into.glob("*/examples/mcore"))
    if not found:
        with tarfile.open(tarball) as tar:
            tar.extractall(into, filter="data")
        found = sorted(into.glob("*/examples/mcore"))
    return found[0]


def pretrain_scripts(mcore: Path) -> list[Path]:
    return sorted([*mcore.glob("qwen3/pretrain_*.sh"), *mcore.glob("qwen3_moe/pretrain_*.sh")])


def tune_scripts(mcore: Path) -> list[Path]:
    return sorted([*mcore.glob("qwen3/tune_*.sh"), *mcore.glob("qwen3_moe/tune_*.sh")])


def filled(text: str, **values: str) -> str:
    """``text`` with the assignments ``NAME=...`` of ``values`` replaced (a value may be several words)."""
    for name, value in values.items():
        text, n = re.subn(rf"^{name}=.*$", lambda _: f'{name}="{value}"', text, flags=re.M)
        if not n:
            raise KeyError(f"the script assigns no {name}")
    return text


# --- scaled-down copies: every flag kept, the sizes made tiny, 2 processes -------------------------------

TINY = {  # flag -> value in the scaled-down copy (a flag the script does not give is not added)
    "--hidden-size": "64", "--ffn-hidden-size": "128", "--num-attention-heads": "4", "--num-query-groups": "2",
    "--kv-channels": "16", "--padded-vocab-size": "256", "--num-experts": "4", "--moe-ffn-hidden-size": "32",
    "--moe-router-topk": "2", "--recompute-num-layers": "1", "--lr": "2e-3", "--min-lr": "2e-4",
}
VOCAB = 256  # the byte tokenizer's


def _layout(text: str) -> dict[str, str]:
    """Parallel sizes for 2 processes keeping the script's kind of parallelism (and its layers)."""
    def var(name: str) -> int:
        found = re.search(rf"^{name}=(\d+)", text, re.M)
        return int(found.group(1)) if found else 1

    sizes = {"TP": "1", "PP": "1", "EP": "1", "CP": "1"}
    noop, vpp = "--noop-layers" in text, bool(re.search(r"^VPP=", text, re.M))
    if noop or vpp or (var("PP") > 1 and var("EP") == 1 and var("TP") == 1):
        sizes["PP"] = "2"
        layers = 8 if noop else 4
        sizes["VPP"] = "2" if noop else "1"
    else:
        layers = 2
        if var("EP") > 1:
            sizes["EP"] = "2"
        elif var("TP") > 1:
            sizes["TP"] = "2"
    sizes["LAYERS"] = str(layers)
    return sizes


def _noop(value: str, layers: int, tiny: int) -> str:
    """Noop layer indices at the same distance from the nearer end of the (tiny) stack."""
    return ",".join(str(i if i < layers // 2 else tiny - (layers - i)) for i in map(int, value.split(",")))


def scaled(text: str, iterations: int = 5) -> str:
    """A scaled-down copy of a pretrain script: 2 processes on one node, tiny sizes, ``iterations`` iterations."""
    sizes = _layout(text)
    layers_given = int(re.search(r"--num-layers (\d+)", text).group(1))
    text = re.sub(r"--num-layers \d+", f"--num-layers {sizes['LAYERS']}", text)
    noop = re.search(r"--noop-layers (\S+)", text)
    if noop:
        text = text.replace(noop.group(0), f"--noop-layers {_noop(noop.group(1), layers_given, int(sizes['LAYERS']))}")
    for flag, value in TINY.items():
        text = re.sub(rf"{flag} [^\s\\]+", f"{flag} {value}", text)
    mbs = int(re.search(r"^MBS=(\d+)", text, re.M).group(1))
    dp = 2 // (int(sizes["TP"]) * int(sizes["PP"]))
    assigned = {"NPUS_PER_NODE": "2", "NNODES": "1", "NODE_RANK": "0", "SEQ_LENGTH": "64",
                "TRAIN_ITERS": str(iterations), "GBS": str(4 * mbs * dp), **{k: sizes[k] for k in ("TP", "PP", "EP", "CP")}}
    if "VPP" in sizes:
        assigned["VPP"] = sizes["VPP"]
    for name, value in assigned.items():
        text = re.sub(rf"^{name}=.*$", f"{name}={value}", text, flags=re.M)
    return text
