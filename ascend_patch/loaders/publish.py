"""Moving a finished conversion into place: the staging directory, and what --force keeps of the old one."""

from __future__ import annotations

import errno
import os
import shutil

from ..errors import FindingError
from .formats import TargetPlan

__all__ = ["OutputAppeared", "STAGING_PREFIX", "publish", "remove_stale_staging"]

STAGING_PREFIX = ".ascend_patch-partial-"


def publish(staging: str, save_dir: str, plan: TargetPlan, force: bool = False) -> list[str]:
    """Move the finished staging directory into place; returns the old entries kept (see below).

    Without --force, ``save_dir`` must still be absent or empty: a directory that another
    process filled while this conversion ran (a second conversion into the same new
    directory) is never replaced (:func:`_publish_new`).

    With --force into a non-empty directory the staging directory becomes the whole new
    directory: every checkpoint file of the old one goes (an old ``model.safetensors``
    beside new shards would be what ``from_pretrained`` loads), everything else
    (tokenizer, README, the user's notes) is hard-linked across first, and the two
    directories are exchanged in one step where the kernel can (``renameat2``).
    """
    save_dir = os.path.abspath(save_dir)
    if not force:
        _publish_new(staging, save_dir)
        return []
    if not os.path.isdir(save_dir) or not os.listdir(save_dir):
        if os.path.isdir(save_dir):
            os.rmdir(save_dir)
        os.rename(staging, save_dir)
        return []
    kept = []
    for entry in sorted(os.listdir(save_dir)):
        if entry in plan.commit_files or entry in plan.side_files or _is_checkpoint_entry(entry):
            continue
        _link_tree(os.path.join(save_dir, entry), os.path.join(staging, entry))
        kept.append(entry)
    os.chmod(staging, os.stat(save_dir).st_mode & 0o7777)  # the directory keeps its permissions
    if not _exchange(staging, save_dir):
        aside = f"{staging}-old"
        os.rename(save_dir, aside)
        try:
            os.rename(staging, save_dir)
        except OSError:
            os.rename(aside, save_dir)  # the old checkpoint stays where it was
            raise
        staging = aside
    shutil.rmtree(staging, ignore_errors=True)  # the old directory
    return kept


class OutputAppeared(FindingError):
    """--save-dir was filled by another process while the conversion ran; nothing was replaced."""


def _publish_new(staging: str, save_dir: str) -> None:
    """``staging`` becomes ``save_dir``, which must not exist (an empty directory is removed first).

    Preflight saw the directory absent or empty, but another process may have written it
    since. ``renameat2(RENAME_NOREPLACE)`` makes the check and the move one step; where the
    kernel or file system lacks it, ``rename`` still refuses a non-empty directory, and only
    the window between the check below and the rename is open.
    """
    if os.path.isdir(save_dir) and not os.path.islink(save_dir) and not os.listdir(save_dir):
        try:
            os.rmdir(save_dir)
        except OSError:  # filled meanwhile: the move below refuses it
            pass
    moved = _rename_noreplace(staging, save_dir)
    if moved is None:
        if os.path.lexists(save_dir):
            raise _appeared(save_dir)
        try:
            os.rename(staging, save_dir)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise _appeared(save_dir) from None
            raise
    elif not moved:
        raise _appeared(save_dir)


def _appeared(save_dir: str) -> OutputAppeared:
    try:
        entries = sorted(os.listdir(save_dir))
    except OSError:
        entries = []
    held = (f" and now holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {', '.join(entries[:5])}"
            f"{' ...' if len(entries) > 5 else ''}") if entries else ""
    return OutputAppeared(f"--save-dir {save_dir} was created by another process while this conversion ran{held} "
                          "(a second conversion into the same directory?); it was not replaced, and this "
                          "conversion's output was removed", "output-appeared",
                          "check which run's checkpoint it holds; pass --force to replace it, or convert into "
                          "another --save-dir")


def _rename_noreplace(src: str, dst: str) -> bool | None:
    """``rename`` that fails when ``dst`` exists (Linux ``renameat2(RENAME_NOREPLACE)``): True when moved,
    False when ``dst`` exists, None where the call is not available."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_noreplace = -100, 1
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the file system or kernel cannot
        return None
    raise OSError(err, os.strerror(err), dst)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".distcp",
                    ".index.json")


def _is_checkpoint_entry(name: str) -> bool:
    """Whether a directory entry is part of a checkpoint (weights, their index, config, Megatron's tracker and
    iteration folders) rather than something beside it (tokenizer, README)."""
    from .megatron_layout import TRACKER, iteration_of

    return (name.endswith(_WEIGHT_SUFFIXES) or name in ("config.json", "generation_config.json", TRACKER)
            or iteration_of(name) is not None or name.startswith(STAGING_PREFIX))


def _link_tree(src: str, dst: str) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b, follow_symlinks=False)
        except OSError:
            shutil.copy2(a, b, follow_symlinks=False)

    if os.path.isdir(src) and not os.path.islink(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    else:
        link(src, dst)


def _exchange(a: str, b: str) -> bool:
    """Swap two directories atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def remove_stale_staging(parent: str) -> None:
    """Staging directories of runs that were killed (their process no longer exists)."""
    for entry in os.listdir(parent):
        if not entry.startswith(STAGING_PREFIX):
            continue
        pid_text = entry[len(STAGING_PREFIX):].split("-", 1)[0]
        try:
            pid = int(pid_text)
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        except PermissionError:
            continue
