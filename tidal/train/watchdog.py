"""A watchdog for the training loop: no step for a configured time -> stacks dumped, distinct exit.

A trainer that hangs (a collective whose peer is gone, a storage call that never returns, a
deadlocked data thread) holds its accelerators and its pod forever while looking alive. Armed after
the first step (so compilation, which may take minutes, never trips it), the watchdog expects
:meth:`Watchdog.beat` after every step; when ``timeout_s`` pass without one it prints one
``tidal.train: error:`` line, dumps every thread's stack (:mod:`faulthandler`, to stderr, where the
pod log keeps it) and ends the process with :data:`EXIT_STALLED`, so the launcher sees a distinct
failure and reruns it (training resumes from the newest checkpoint in the bucket).

Configured by ``TIDAL_TRAIN_WATCHDOG_S`` (:class:`tidal.settings.Settings`; unset: off), an
operational setting that does not change what the step computes, so it is not part of its id.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Self

# sysexits.h has nothing for "hung"; 76 (EX_PROTOCOL) is taken by nothing tidal exits with, and
# is next to EXIT_PREEMPTED (75), the other "rerun me" code
EXIT_STALLED = 76


class Watchdog:
    """A daemon thread that ends the process when no :meth:`beat` came for ``timeout_s`` seconds.

    Args:
        timeout_s: seconds without a step that count as a hang (> 0), or None: do nothing.
        what: named in the error line (``"training step"``).
    """

    def __init__(self, timeout_s: float | None, what: str = "training step"):
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"watchdog timeout must be > 0 seconds, got {timeout_s}")
        self.timeout_s, self.what = timeout_s, what
        self._last: float | None = None  # None: not armed yet
        self._step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, step: int) -> None:
        """Step ``step`` finished (arms the watchdog on the first call)."""
        self._step, self._last = step, time.monotonic()

    def _watch(self) -> None:
        assert self.timeout_s is not None
        while not self._stop.wait(min(self.timeout_s / 4, 5.0)):
            last = self._last
            if last is not None and time.monotonic() - last > self.timeout_s:
                print(f"tidal.train: error: no {self.what} finished for {time.monotonic() - last:.0f} s after step "
                      f"{self._step} (TIDAL_TRAIN_WATCHDOG_S={self.timeout_s:g}); the stacks of every thread "
                      f"follow; exiting {EXIT_STALLED} (rerun to resume from the newest checkpoint)",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(EXIT_STALLED)

    def __enter__(self) -> Self:
        if self.timeout_s is not None:
            self._thread = threading.Thread(target=self._watch, name="tidal-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


__all__ = ["EXIT_STALLED", "Watchdog"]
