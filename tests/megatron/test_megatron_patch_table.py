"""docs/megatron.md's patch table is the registry's: every megatron-core patch, with reason and range."""

from __future__ import annotations

import os

import pytest

from ascend_patch.adaptors.megatron import patch_table as PT
from helpers import REPO

DOC = os.path.join(REPO, "docs", "megatron.md")


def test_the_doc_table_is_the_generated_one():
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    start, end = doc.index(PT.BEGIN) + len(PT.BEGIN), doc.index(PT.END)
    assert doc[start:end].strip() == PT.megatron_patch_markdown(), (
        "docs/megatron.md's patch table is stale; regenerate it with "
        "`python -m ascend_patch.adaptors.megatron.patch_table --update docs/megatron.md`")


def test_every_megatron_patch_of_every_plugin_is_listed_with_reason_and_range():
    import megatron.core.fusions.fused_bias_gelu  # noqa: F401  (compiled at import: its jit patch joins the row)

    table = PT.megatron_patch_markdown()
    by_target = PT.megatron_patches_by_target()
    owners = {p.owner for per in by_target.values() for p in per.values()}
    assert {"megatron", "megatron_training"} <= owners  # megatron-core's and Megatron-LM's patches
    for target in ("megatron.core.fusions.fused_layer_norm:FusedLayerNorm.__new__",
                   "megatron.core.models.common.embeddings.rope_utils:fused_apply_rotary_pos_emb",
                   "megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl",
                   "megatron.core.fusions.fused_bias_gelu:bias_gelu_impl",
                   "megatron.core.fusions.fused_softmax:FusedScaleMaskSoftmax.forward_fused_softmax"):
        assert target in by_target
    for target, per_backend in by_target.items():
        patch = next(iter(per_backend.values()))
        assert patch.reason
        if target.startswith("megatron."):
            assert patch.versions is None and (patch.package is None or patch.needed), target
            if not PT._is_jit(patch):  # the functions jit_fuser compiled share its row
                assert f"`{target}`" in table
        for p in per_backend.values():
            assert p.reason in table
    assert by_target["megatron.core.tensor_parallel.random:CudaRNGStatesTracker.fork"].keys() == {"cpu"}
    # the npu RMSNorm reason is the npu target's own
    norm = by_target["megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__"]
    assert "npu_rms_norm" in norm["npu"].reason and "npu_rms_norm" not in norm["cpu"].reason


def test_replace_table_needs_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{PT.BEGIN}\nold\n{PT.END}\noutro\n")
    PT.replace_table(str(page), "| new |")
    assert page.read_text() == f"intro\n{PT.BEGIN}\n| new |\n{PT.END}\noutro\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="no .* markers"):
        PT.replace_table(str(tmp_path / "bare.md"), "| new |")
