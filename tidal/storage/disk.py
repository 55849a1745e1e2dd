"""A full disk, recognized wherever it surfaces (our writes, Beam's workers, orbax, pyarrow).

A step that runs out of space fails with :class:`DiskFull`: one line naming the step, the
directory and its free space, and what to do. Its partial output is removed rather than kept in
``.failed/`` (keeping it there, on the same full disk, would make every retry fail sooner and
leave another copy each time).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

__all__ = ["DiskFull", "disk_full_error", "is_disk_full"]

_MESSAGES = ("No space left on device", "Disk quota exceeded", "[Errno 28]", "[Errno 122]")
_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """The step's working directory (or the storage root) has no space left; one line for the user."""


def is_disk_full(err: BaseException) -> bool:
    """True when ``err`` or any exception in its cause/context chain is ENOSPC/EDQUOT, or says so in
    its message (Beam's runners re-raise a worker's error as text in a ``RuntimeError``)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _ERRNOS:
            return True
        if any(m in str(cur) for m in _MESSAGES):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def disk_full_error(step_id: str, where: Path) -> DiskFull:
    """The :class:`DiskFull` of ``step_id`` working under ``where`` (free and total space measured now)."""
    try:
        usage = shutil.disk_usage(where if where.exists() else where.parent)
        space = f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB"
    except OSError:
        space = "free space unknown"
    err = DiskFull(f"step {step_id}: no space left on device under {where} ({space}); the partial "
                    "attempt was removed, not kept in .failed/. Free space there, or point TIDAL_STORAGE_CACHE / "
                    "the storage root at a larger disk, then rerun: committed steps are kept")
    err.errno = errno.ENOSPC
    return err
