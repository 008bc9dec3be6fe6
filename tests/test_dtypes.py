"""The one dtype table: every spelling maps to torch's name, sizes and codes agree with torch's."""

from __future__ import annotations

import pytest
import torch

from ascend_patch import dtypes


def test_every_spelling_names_torchs_dtype():
    for spelling in (torch.bfloat16, "torch.bfloat16", "bfloat16", "bf16"):
        assert dtypes.canonical(spelling) == "bfloat16"
    assert dtypes.canonical("half") == "float16" and dtypes.canonical("float") == "float32"
    assert dtypes.canonical("fp32") == "float32" and dtypes.canonical("torch.int8") == "int8"
    assert dtypes.canonical("complex32") == "complex32"  # passed through; itemsize refuses it
    assert dtypes.short_name(torch.float16) == "fp16" and dtypes.short_name("float32") == "fp32"
    assert dtypes.short_name("int8", default="fp32") == "fp32"
    with pytest.raises(ValueError, match="not a floating dtype"):
        dtypes.short_name("int8")
    assert dtypes.SHORT_NAMES == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    assert dtypes.FLOATING == ("float32", "bfloat16", "float16")


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_the_table_agrees_with_torch_and_safetensors():
    import safetensors.torch

    for name, d in dtypes.DTYPES.items():
        t = dtypes.torch_dtype(name)
        assert torch.empty(0, dtype=t).element_size() == d.itemsize == dtypes.itemsize(name), name
        assert getattr(torch, d.storage).dtype is t, name  # the legacy storage class torch.save pickles
        # safetensors' own code for the dtype (what its headers hold)
        assert safetensors.torch._TYPES[d.safetensors] is t, name
        assert dtypes.from_safetensors(d.safetensors) == name
    assert dtypes.from_safetensors("F8_E4M3") is None
    with pytest.raises(ValueError, match="unsupported tensor dtype 'complex32'"):
        dtypes.itemsize("complex32")
