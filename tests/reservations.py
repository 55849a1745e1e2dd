"""Names reserved per process across concurrent test processes (tests/ports.py: ports; tests/cluster/network.py:
cluster networks): a file created with ``O_EXCL`` holds the owner's pid; one whose owner has exited is taken over."""

from __future__ import annotations

import fcntl
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
    owner has exited is taken over, ``on_stale`` called first (to clean up what the dead owner left).

    The check and the write happen under an exclusive ``flock`` of ``directory/.lock``: without it, two
    processes starting together (two xdist workers' clusters) could both read a reservation file before its
    owner wrote its pid into it, take it for stale, and both hold the name.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            owner = int(path.read_text() or "0")
        except FileNotFoundError:
            owner = None
        except (OSError, ValueError):
            return False
        if owner is not None:
            if owner == os.getpid() or (owner and alive(owner)):
                return False
            if on_stale is not None:
                on_stale()
        tmp = directory / f".{name}.{os.getpid()}"
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)  # the file appears with its pid in it, never empty
        return True
