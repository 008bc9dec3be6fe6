"""TEST DOUBLE of the torch_npu package, importable only where a test puts its folder on sys.path.

Importing it does to torch what importing torch_npu does: the privateuse1 backend
becomes "npu" and ``torch.npu`` appears (here :class:`npu_double.FakeNpuModule`, with
tensors from :mod:`npu_tensor_double`). What the double cannot hold, it records:

* ``IMPORT_ENV``: the NPU runtime variables at import time, so a test can tell whether
  ascend_patch set them before torch_npu was imported;
* ``RESTORED``: the location ``torch.load`` restores each storage to (``"npu:1"``); the
  double has no npu storage, so the storage stays in host memory;
* ``GENERATORS``: the device each ``torch.Generator`` was built for; generators of a
  Python-only backend cannot be made, so ``torch.Generator`` is a recording subclass
  that builds a host generator (``isinstance`` checks keep working).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import npu_tensor_double  # noqa: E402

IMPORT_ENV = {name: os.environ.get(name) for name in ("ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF")}
RESTORED: list = []
GENERATORS: list = []
module = npu_tensor_double.install()


def _never_tags(storage):
    return None


def _restore(storage, location):
    if location == "npu" or location.startswith("npu:"):
        RESTORED.append(location)
        return storage
    return None


# before torch's own privateuse1 entry (priority 23), which needs a real npu allocator
torch.serialization.register_package(19, _never_tags, _restore)


class RecordingGenerator(torch.Generator):
    """``torch.Generator`` that records the device asked for and builds a host generator."""

    def __new__(cls, device="cpu"):
        GENERATORS.append(str(device))
        return super().__new__(cls, "cpu")


torch.Generator = RecordingGenerator


def _autoload():
    """torch's device-backend autoload entry point (``torch.backends`` group): importing did the work."""
