"""The second test environment: Python 3.12 with this repository's test requirements, for Megatron-LM main.

Megatron-LM main imports ``typing.override`` (Python >= 3.12); the project's own environment may be older
(3.11 here). This builds a venv from a Python 3.12 found on the machine (never a hard-coded path):

    python tests/megatron_lm/py312_env.py [DEST]      # default DEST: $MEGATRON_PY312_VENV, else .venv312

``pip install -e '.[test]'`` into it brings torch 2.13.0 (for cp312 the registry's CUDA build, about 1.35 GB
to download and 5 GB installed, with triton; the harness hides triton where a test asks, see
``hide_triton/``) and pybind11, which Megatron-LM's dataset-helper build runs. No CPU build of torch 2.13 for
cp312 is on the registries this project installs from (PyPI has the CUDA one; the local wheel folder only the
cp311 CPU one), so the environment costs about 2 minutes and 5 GB: tests do not build it. The
``megatron_release`` fixture uses it when :func:`ready` finds it and skips main's tests otherwise, saying how to
build it; CI builds it in a step of its own (``.ci/run``). A finished build leaves a marker holding the hash
of ``pyproject.toml``: without it (an interrupted build) the environment is not ready, and :func:`ensure`
installs again when the hash differs.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NEEDED = (3, 12)
MARKER = ".ascend-patch-test-env"


def default_dest() -> Path:
    return Path(os.environ.get("MEGATRON_PY312_VENV") or REPO / ".venv312")


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # e.g. a pyenv shim for a version that is not the selected one
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def find_python(needed: tuple[int, int] = NEEDED) -> str:
    """A Python ``needed`` (major, minor) on this machine: ``$PYTHON312``, ``python3.12`` on PATH, or pyenv's."""
    name = "python{}.{}".format(*needed)
    candidates = [os.environ.get("PYTHON312", ""), shutil.which(name) or ""]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        installed = sorted(glob.glob(os.path.join(root, "versions", "{}.{}.*".format(*needed), "bin", name)),
                           key=lambda p: [int(x) for x in Path(p).parents[1].name.split(".") if x.isdigit()])
        candidates += installed[::-1]  # the newest patch release first
    tried = []
    for candidate in filter(None, candidates):
        tried.append(candidate)
        if _version_of(candidate) == needed:
            return candidate
    raise RuntimeError(f"no Python {'.'.join(map(str, needed))} found (tried: {', '.join(tried) or 'nothing'}); "
                       f"install one (e.g. `pyenv install {'.'.join(map(str, needed))}`) or set PYTHON312 to it")


def _fingerprint() -> str:
    return hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()


def python_of(dest: Path) -> Path:
    return dest / "bin" / "python"


def ready(dest: Path | None = None) -> Path | None:
    """The python of a finished environment at ``dest`` (default :func:`default_dest`), or None."""
    dest = Path(dest or default_dest())
    return python_of(dest) if (dest / MARKER).is_file() and _version_of(str(python_of(dest))) == NEEDED else None


HOW_TO_BUILD = ("Megatron-LM main needs Python 3.12: build its environment first with "
                "`python tests/megatron_lm/py312_env.py [DEST]` (about 2 minutes, 1.35 GB to download, 5 GB on disk; "
                "DEST defaults to $MEGATRON_PY312_VENV, else .venv312), as .ci/run does")


def ensure(dest: Path | None = None, *, quiet: bool = True) -> Path:
    """The python of a ready environment at ``dest`` (built or brought up to date first)."""
    dest = Path(dest or default_dest())
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == _fingerprint() and python_of(dest).exists():
        return python_of(dest)
    if _version_of(str(python_of(dest))) != NEEDED:  # no venv there yet (or not a usable one)
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run([find_python(), "-m", "venv", str(dest)], check=True)
    pip = [str(python_of(dest)), "-m", "pip", "install", *(["-q"] if quiet else [])]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*pip, "-e", f"{REPO}[test]"], check=True)
    marker.write_text(_fingerprint() + "\n")
    return python_of(dest)


def main() -> None:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else default_dest()
    python = ensure(dest, quiet=False)
    print(subprocess.run([str(python), "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip(), python)


if __name__ == "__main__":
    main()
