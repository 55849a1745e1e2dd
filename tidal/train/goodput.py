"""Goodput of a training process: productive step seconds over wall seconds, and where the rest went.

``goodput = productive / wall`` where ``wall`` runs from the start of :func:`tidal.train.trainer.train`
to its summary, and ``productive = steps run x step time`` (the mean time of the steps that were
neither the first, compiling, one nor an eval or checkpoint step: what a step costs when nothing
else happens). The badput, by cause, in seconds:

* ``startup``: reading the spec and inputs, building the model, compiling the eval programs,
  initializing the state of a fresh start;
* ``restore``: opening the checkpoints and restoring (from the bucket: downloading) the newest
  (on a fresh start: only the opening and the search);
* ``compile``: the first step's time beyond one step time (tracing and compiling the step, and
  reading its batch);
* ``data_wait``: the loop waiting for a batch after the first (the read-ahead did not keep up);
* ``checkpoint``: the loop blocked by a save (the previous one still writing, the host copy) and
  the final wait for the last checkpoint to count;
* ``eval``: held-out evaluations;
* ``other``: the rest (logging, metrics, hooks, the Python loop itself; 0 when the step-time
  estimate of the productive seconds leaves nothing).

The definition follows Google's ML Productivity Goodput (productive training time over the time
the job holds its accelerators; the ``ml-goodput-measurement`` package), measured per process: the
steps a lost process did after its last checkpoint are badput of that process, which could not
report it; ``bench/node_loss.py`` measures the goodput of a whole run with losses from outside.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

CAUSES = ("startup", "restore", "compile", "data_wait", "checkpoint", "eval")


class Goodput:
    """Badput clocks of one training process (module docstring); ``clock``: seconds, monotonic."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.badput: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def timing(self, cause: str) -> Iterator[None]:
        """Count the time of the ``with`` body as badput of ``cause`` (one of :data:`CAUSES`)."""
        tick = self.clock()
        try:
            yield
        finally:
            self.badput[cause] += self.clock() - tick

    def timed(self, cause: str, fn: Callable) -> Callable:
        """``fn`` with its calls counted as badput of ``cause`` (a hook, a save)."""

        def wrapper(*args, **kwargs):
            with self.timing(cause):
                return fn(*args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "timed")
        return wrapper

    def summary(self, steps_run: int, step_time_s: float | None, first_step_s: float | None) -> dict[str, float]:
        """``goodput``, ``goodput_wall_s``, ``goodput_productive_s`` and ``badput_s/<cause>`` for every
        cause of :data:`CAUSES` plus ``other``; nothing when no step was timed (fewer than 2 steps)."""
        if not step_time_s or steps_run <= 0:
            return {}
        wall = self.clock() - self.start
        productive = steps_run * step_time_s
        badput = {cause: self.badput.get(cause, 0.0) for cause in CAUSES}
        badput["compile"] = max((first_step_s or step_time_s) - step_time_s, 0.0)
        badput["other"] = max(wall - productive - sum(badput.values()), 0.0)
        return {"goodput": productive / wall, "goodput_wall_s": wall, "goodput_productive_s": productive,
                **{f"badput_s/{cause}": seconds for cause, seconds in badput.items()}}


__all__ = ["CAUSES", "Goodput"]
