"""Names reserved per process across concurrent test processes (tests/ports.py: ports; tests/cluster/network.py:
cluster networks): a file created with ``O_EXCL`` holds the owner's pid; one whose owner has exited is taken over."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserve(directory: Path, name: str, on_stale: Callable[[], None] | None = None) -> bool:
    """Reserve ``name`` under ``directory`` for this process; True when it is ours now. A reservation whose
    owner has exited is taken over, ``on_stale`` called first (to clean up what the dead owner left)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                owner = int(path.read_text() or "0")
            except (OSError, ValueError):
                return False
            if owner and alive(owner):
                return False
            if on_stale is not None:
                on_stale()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False
