"""The error base and the one finding shape."""

from __future__ import annotations

import pytest

from ascend_patch.errors import AscendPatchError, Finding, FindingError


def test_a_finding_reads_as_message_then_remedy():
    f = Finding("layers", "28 layers cannot be split over 8 pipeline stages", "use 1, 2, 4, 7, 14 or 28")
    assert str(f) == "28 layers cannot be split over 8 pipeline stages; use 1, 2, 4, 7, 14 or 28"
    assert str(Finding("x", "only a message")) == "only a message"
    assert str(Finding("x", "It was saved at TP=2.", "Re-shard it first.")) == "It was saved at TP=2. Re-shard it first."
    assert f == Finding("layers", f.message, f.remedy) and hash(f) == hash(Finding("layers", f.message, f.remedy))


def test_a_finding_error_carries_its_finding():
    with pytest.raises(ValueError) as info:
        raise FindingError("8 heads cannot be split over 3 ranks", "heads", "use 1, 2, 4 or 8")
    err = info.value
    assert isinstance(err, AscendPatchError)
    assert str(err) == "8 heads cannot be split over 3 ranks; use 1, 2, 4 or 8"
    assert err.code == "heads" and err.finding == Finding("heads", "8 heads cannot be split over 3 ranks",
                                                          "use 1, 2, 4 or 8")


def test_every_error_class_of_the_restructured_folders_has_the_base():
    """A command catches AscendPatchError and prints the message; a class outside it would give a traceback."""
    import importlib
    import pkgutil

    import ascend_patch

    roots = ("ascend_patch.check", "ascend_patch.comm", "ascend_patch.demo", "ascend_patch.loaders",
             "ascend_patch.models", "ascend_patch.parallel")
    names = ["ascend_patch.errors", "ascend_patch.dtypes", "ascend_patch.registry"]
    for info in pkgutil.walk_packages(ascend_patch.__path__, "ascend_patch."):
        if info.name.startswith(roots) and not info.name.endswith("__main__"):
            names.append(info.name)
    found = {}
    for name in names:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (isinstance(value, type) and issubclass(value, Exception) and value.__module__ == name
                    and not attr.startswith("_")):
                found[f"{name}.{attr}"] = value
    assert len(found) >= 14, sorted(found)  # the ones this test was written against, at least
    outside = sorted(n for n, cls in found.items() if not issubclass(cls, AscendPatchError))
    assert outside == []
