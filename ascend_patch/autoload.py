"""A bad setting under ``ASCEND_PATCH_AUTOLOAD`` stops the process instead of running it unpatched.

The installed ``ascend_patch_autoload.pth`` imports ascend_patch in every Python process
that starts while ``ASCEND_PATCH_AUTOLOAD`` is set to anything but ``0`` (or empty); the
import reads the variable like every other boolean variable, so ``1`` is the one value
that turns it on and anything else (``yes``, ``true``) is refused. A refused value, in it
or in any other ``ASCEND_PATCH_*`` variable, raises :class:`ConfigError` during that
import. site.py would print it as a traceback once per site directory and then run the
program unpatched: :func:`stop_if_autoloading` prints the message once and ends the
process with status 2 instead (nothing of the program has run yet).
"""

from __future__ import annotations

import os
import sys

from .config import ConfigError

__all__ = ["EXIT_STATUS", "imported_by_site", "stop_if_autoloading"]

EXIT_STATUS = 2


def imported_by_site() -> bool:
    """Whether the import under way comes from a ``.pth`` file that site.py is processing."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "addpackage" and "site" in os.path.basename(code.co_filename):
            return True
        frame = frame.f_back
    return False


def stop_if_autoloading(error: ConfigError) -> None:
    """End the process with the message when ``import ascend_patch`` came from the autoload .pth file."""
    if not imported_by_site():
        return  # `import ascend_patch` in a program: the ConfigError itself stops it
    sys.stderr.write(
        f"ascend_patch: {error}\n"
        "ascend_patch: ASCEND_PATCH_AUTOLOAD is set, so this process must not run unpatched: it stops here "
        f"(exit status {EXIT_STATUS}). Fix the variable, or unset ASCEND_PATCH_AUTOLOAD.\n")
    sys.stderr.flush()
    # SystemExit would be one more traceback from site.py per site directory, and Python would go on
    os._exit(EXIT_STATUS)
