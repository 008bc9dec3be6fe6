"""``python -m ascend_patch SCRIPT|-m MODULE [args]``: run a CUDA program patched."""

from __future__ import annotations

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
