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


_SCAN = """
import importlib, json, pkgutil
import ascend_patch
from ascend_patch.errors import AscendPatchError
found = {}
for info in pkgutil.walk_packages(ascend_patch.__path__, "ascend_patch."):
    if info.name.endswith("__main__"):
        continue
    module = importlib.import_module(info.name)
    for attr, value in vars(module).items():
        if (isinstance(value, type) and issubclass(value, Exception) and value.__module__ == info.name
                and not attr.startswith("_")):
            found[info.name + "." + attr] = issubclass(value, AscendPatchError)
print(json.dumps(found))
"""


def test_every_error_class_of_the_package_has_the_base():
    """A command catches AscendPatchError and prints the message; a class outside it would give a traceback.

    Scanned in a child: importing every module (megatron-core among them) must not change this session.
    """
    import json
    import subprocess
    import sys

    from helpers import child_env

    out = subprocess.run([sys.executable, "-c", _SCAN], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                         text=True, timeout=300, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert len(found) >= 20, sorted(found)  # the ones this test was written against, at least
    outside = sorted(name for name, based in found.items() if not based)
    assert outside == []
