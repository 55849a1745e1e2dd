"""Preemption: a SIGTERM flag the training loop polls, the exception and the exit code.

GKE sends SIGTERM before a spot VM goes and waits ``terminationGracePeriodSeconds``; the
trainer checkpoints at the next step boundary and exits with :data:`EXIT_PREEMPTED`.
"""

from __future__ import annotations

import signal
from typing import Any, Self

import jax
import numpy as np

# sysexits.h EX_TEMPFAIL: "temporary failure; the user is invited to retry" -- the state is
# checkpointed and a rerun resumes from it.
EXIT_PREEMPTED = 75


class Preempted(RuntimeError):
    """SIGTERM arrived; the state was checkpointed at ``step`` and the run stopped (exit 75)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"preempted: checkpoint of step {step} saved; rerun to resume")


class SigtermFlag:
    """A SIGTERM flag for the duration of a ``with`` block (main thread only)."""

    def __init__(self):
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> Self:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread (e.g. called from a test thread): no handler
            self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def agreed(self, sync_point: bool) -> bool:
        """Whether to stop now. One process: the flag. Several: at sync points only, stop if
        any process got SIGTERM (all must take the collective checkpoint together)."""
        if jax.process_count() == 1:
            return self.requested
        if not sync_point:
            return False
        from tidal.train.distributed import sum_over_processes

        return bool(sum_over_processes(np.array([int(self.requested)], np.int32))[0])  # how many got SIGTERM
