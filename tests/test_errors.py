"""The error base and the one finding shape."""

from __future__ import annotations

import pytest

from ascend_patch.errors import AscendPatchError, Finding, FindingError


def test_a_finding_reads_as_message_then_remedy():
    f = Finding("layers", "28 layers cannot be split over 8 pipeline stages", "use 1, 2, 4, 7, 14 or 28")
    assert str(f) == "28 layers cannot be split over 8 pipeline stages; use 1, 2, 4, 7, 14 or 28"
    assert str(Finding("x", "only a message")) == "only a message"
    assert f == Finding("layers", f.message, f.remedy) and hash(f) == hash(Finding("layers", f.message, f.remedy))


def test_a_finding_error_carries_its_finding():
    with pytest.raises(ValueError) as info:
        raise FindingError("8 heads cannot be split over 3 ranks", "heads", "use 1, 2, 4 or 8")
    err = info.value
    assert isinstance(err, AscendPatchError)
    assert str(err) == "8 heads cannot be split over 3 ranks; use 1, 2, 4 or 8"
    assert err.code == "heads" and err.finding == Finding("heads", "8 heads cannot be split over 3 ranks",
                                                          "use 1, 2, 4 or 8")
