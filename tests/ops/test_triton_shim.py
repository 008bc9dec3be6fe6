"""The triton shim: served to the megatron-core modules that cannot import without it, by a rule."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ascend_patch.adaptors.megatron import triton_shim

from helpers import child_env

_GUARDED = """
try:
    import triton
except ImportError:
    triton = None
try:
    from megatron.fake import plain
except (RuntimeError, ModuleNotFoundError):
    plain = None
"""


def test_the_rule_serves_megatron_importers_without_a_fallback_on_their_chain(tmp_path, patched, monkeypatch):
    """A megatron module importing triton gets the shim unless that import, or the import of that module by
    another megatron module, sits in a try that catches ImportError; a non-megatron importer never does."""
    if importlib.util.find_spec("triton") is not None and "shim" not in str(importlib.util.find_spec("triton").origin):
        pytest.skip("a real triton is installed here")
    fake = tmp_path / "megatron" / "fake"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "plain.py").write_text("import triton\nimport triton.language as tl\n"
                                   "VERSION, INT = triton.__version__, tl.int64\n\n\n"
                                   "@triton.jit\ndef kernel(x, n: tl.constexpr):\n    pass\n")
    (fake / "guarded.py").write_text(_GUARDED)
    (fake / "chain.py").write_text("from megatron.fake import plain\n")
    (tmp_path / "outsider.py").write_text("import triton\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("megatron.core")
    monkeypatch.setattr(sys.modules["megatron"], "__path__", [*sys.modules["megatron"].__path__, str(tmp_path / "megatron")])
    for name in ("megatron.fake", "megatron.fake.plain", "megatron.fake.guarded", "megatron.fake.chain", "outsider"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    guarded = importlib.import_module("megatron.fake.guarded")
    assert guarded.triton is None and guarded.plain is None  # its own try, and its try around the chain
    assert "megatron.fake.plain" not in sys.modules
    chain = importlib.import_module("megatron.fake.chain")  # unguarded all the way: served
    assert chain.plain.VERSION == triton_shim.TRITON_VERSION == "3.4.0" and repr(chain.plain.INT) == "triton.language.int64"
    with pytest.raises(ModuleNotFoundError, match="No module named 'triton'"):
        importlib.import_module("outsider")


def test_guarded_lines_are_the_bodies_of_tries_that_catch_import_error(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import a\ntry:\n    import b\n    import c\nexcept ValueError:\n    pass\n"
                      "try:\n    import d\nexcept (OSError, ImportError):\n    d = None\n"
                      "try:\n    import e\nexcept:\n    raise\n")
    assert triton_shim.guarded_lines(str(source)) == {8, 12}


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
