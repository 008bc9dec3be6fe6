"""Make ``triton`` unimportable in this process and its children, as on an Ascend host, even where torch's
CUDA wheel installed it (the harness puts this folder on PYTHONPATH for launches with ``hide_triton``).

The path finder is replaced by a subclass that never finds ``triton``: ``importlib.util.find_spec("triton")``
is None and ``import triton`` raises ModuleNotFoundError, as when it is not installed, while finders put in
front of ``sys.meta_path`` later (ascend_patch's triton shim) still serve their modules. A subclass, not a
wrapper object: ``importlib.metadata`` calls ``find_distributions`` on every meta-path finder, and the
distribution metadata must stay readable (ascend_patch asks it for megatron-core's wheel).
"""

import sys
from importlib.machinery import PathFinder


class PathFinderWithoutTriton(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [PathFinderWithoutTriton if finder is PathFinder else finder for finder in sys.meta_path]
