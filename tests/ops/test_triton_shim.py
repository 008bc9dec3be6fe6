"""The triton shim: importable by exactly the megatron-core modules that cannot import without it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ascend_patch.adaptors.megatron import triton_shim

from helpers import child_env

BIK = "megatron.core.transformer.custom_layers.batch_invariant_kernels"


def _top_level_triton_importers() -> set[str]:
    spec = importlib.util.find_spec("megatron.core")
    root = os.path.dirname(os.path.dirname(spec.origin))  # .../megatron
    found = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:  # module level, outside try/if
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == "triton" or n.startswith("triton.") for n in names):
                    rel = os.path.relpath(path[:-3], os.path.dirname(root)).replace(os.sep, ".")
                    found.add(rel)
    return found


def test_the_served_importers_are_megatron_cores_unguarded_triton_imports():
    # fused_kv_append_kernel also imports triton at module level, but its only importer
    # (dynamic_context) guards that import with try/except ImportError: it keeps its fallback
    guarded = {"megatron.core.inference.contexts.fused_kv_append_kernel"}
    assert _top_level_triton_importers() == set(triton_shim.IMPORTERS) | guarded


def test_helpers_compute_what_triton_computes():
    assert [triton_shim.cdiv(x, 4) for x in (0, 1, 4, 5, 9)] == [0, 1, 1, 2, 3]
    assert [triton_shim.next_power_of_2(n) for n in (0, 1, 2, 3, 5, 64, 65)] == [1, 1, 2, 4, 8, 64, 128]


def test_anyone_else_importing_triton_finds_it_missing(patched):
    if importlib.util.find_spec("triton") is not None and "shim" not in str(importlib.util.find_spec("triton").origin):
        pytest.skip("a real triton is installed here")
    with pytest.raises(ModuleNotFoundError, match="No module named 'triton'"):
        import triton  # noqa: F401
    assert "triton" not in sys.modules


_CHILD = r"""
import json, sys
import ascend_patch
from ascend_patch.config import Settings
ascend_patch.apply(Settings(device="cpu"))
out = {}
import megatron.core.utils as utils
out["utils.HAVE_TRITON"] = utils.HAVE_TRITON
import megatron.core.transformer.custom_layers.batch_invariant_kernels as bik
out["bik.triton is a shim"] = getattr(bik.triton, "__ascend_patch_shim__", False)
out["triton cached after import"] = "triton" in sys.modules or "triton.language" in sys.modules
import megatron.core.fusions.fused_indices_converter as fic
out["fused_indices_converter.HAVE_TRITON"] = bool(fic.HAVE_TRITON)
import megatron.core.inference.contexts.dynamic_context as dc
out["dynamic_context kv kernel"] = dc.triton_append_key_value_cache
import torch.utils._triton as tt
out["torch has_triton_package"] = tt.has_triton_package()
import torch
try:
    bik.matmul_persistent(torch.ones(2, 2), torch.ones(2, 2))
except Exception as exc:
    out["launch"] = [type(exc).__name__, str(exc)]
ascend_patch.remove()
out["triton after remove"] = "triton" in sys.modules
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_megatron_imports_with_the_shim_and_keeps_its_fallbacks():
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=child_env(), capture_output=True, text=True,
                          timeout=300)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[0][len("RESULT"):])
    assert out["bik.triton is a shim"] is True
    assert out["triton cached after import"] is False
    # every try/except importer of triton still sees it missing and keeps its own fallback
    assert out["utils.HAVE_TRITON"] is False
    assert out["fused_indices_converter.HAVE_TRITON"] is False
    assert out["dynamic_context kv kernel"] is None
    assert out["torch has_triton_package"] is False
    kind, message = out["launch"]
    assert kind == "TritonUnavailable"
    assert "matmul_kernel_persistent" in message and "--batch-invariant-mode" in message
    assert out["triton after remove"] is False
