"""The divergence guard: a non-finite loss or gradient norm, or a loss spike, and what it does.

Configured by the train config's ``divergence`` section (:class:`tidal.train.config.DivergenceConfig`;
absent: no guard, and the step function is the unguarded one). After every step the loss and the
global gradient norm come to the host (one small device sync a step) and are judged:

* **non-finite**: the loss or the gradient norm is NaN or infinite;
* **spike**: the loss is above ``spike_factor`` times the median of the last ``window`` accepted
  losses (judged once ``min_history`` losses were accepted). The median, not the mean, so one spike
  does not raise the bar for the next (the loss-spike rule of PaLM, Chowdhery et al. 2022, §5.1,
  restarted from a checkpoint and skipped batches; OPT's logbook did the same by hand).

Then the ``action``:

* ``fail``: stop with :class:`Diverged` (exit 1), naming the step, the values and the batch;
* ``skip``: the update is not applied (the step function keeps the old state when the loss is
  non-finite or above the ceiling it is given, computed on the device, so the parameters never
  hold the bad update) and training goes on;
* ``rerun``: restore the newest checkpoint and redo the steps since (:class:`Rerun`); the trainer is
  deterministic, so if the same step diverges again the cause is the data or the model and the run
  stops (verdict ``repeats``); if it does not, the hardware is suspect (verdict ``did not repeat``)
  and training goes on. At most ``max_reruns`` reruns per process.

Every event is a line of ``divergence.jsonl`` in the step directory (step, kind, loss, grad norm,
ceiling, action, verdict, the batch's sequences as ``shard:row``), a WARNING, and counted in the
summary. The accepted-loss history is saved with each checkpoint (its manifest's ``trainer`` entry),
so a resumed run judges the next steps exactly as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

from tidal.train.config import DivergenceConfig

EVENTS = "divergence.jsonl"
BATCH_IDS_MAX = 32  # sequences named per event (the rest are counted)


class Diverged(RuntimeError):
    """The run diverged and the guard stopped it; ``event`` is the ``divergence.jsonl`` record."""

    def __init__(self, event: dict[str, Any]):
        self.event = event
        batch = ", ".join(event["batch"][:8]) + (" ..." if len(event["batch"]) > 8 else "")
        super().__init__(f"divergence at step {event['step']}: {event['kind']} (loss {event['loss']}, grad norm "
                         f"{event['grad_norm']}, ceiling {event['ceiling']}); {event['verdict']}; batch {batch}; "
                         f"rule: train.divergence.action={event['action']}")


class Rerun(Exception):
    """Restore the newest checkpoint and redo the steps since (``action: rerun``)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"rerun from the last checkpoint after a divergence at step {step}")


class Guard:
    """Judges each step's loss and gradient norm (module docstring).

    Args:
        cfg: the ``divergence`` section.
        batch_ids: 1-based step -> the batch's sequences as ``shard:row`` strings.
        write: called with each event (e.g. appends it to ``divergence.jsonl``); must not raise.
        log: WARNING per event.
    """

    def __init__(self, cfg: DivergenceConfig, batch_ids: Callable[[int], list[str]],
                 write: Callable[[dict[str, Any]], None] | None = None, log: logging.Logger | None = None):
        self.cfg, self.batch_ids, self.write = cfg, batch_ids, write
        self.log = log or logging.getLogger("tidal.train.divergence")
        self.history: deque[float] = deque(maxlen=cfg.window)
        self.events: list[dict[str, Any]] = []
        self.reruns: set[int] = set()  # steps rerun from a checkpoint in this process

    @property
    def ceiling(self) -> float:
        """The largest loss the next step may have: ``spike_factor x`` the running median (inf until
        ``min_history`` losses were accepted)."""
        if len(self.history) < self.cfg.min_history:
            return math.inf
        return self.cfg.spike_factor * statistics.median(self.history)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the guard (the accepted losses of the window)."""
        return {"history": list(self.history)}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's :meth:`state` (None: from the start)."""
        self.history = deque((state or {}).get("history", []), maxlen=self.cfg.window)

    def _event(self, step: int, kind: str, loss: float, grad_norm: float, ceiling: float, verdict: str) -> dict:
        ids = self.batch_ids(step)
        event = {"step": step, "kind": kind, "loss": loss, "grad_norm": grad_norm, "ceiling": ceiling,
                 "action": self.cfg.action, "verdict": verdict, "batch": ids[:BATCH_IDS_MAX],
                 "batch_size": len(ids)}
        self.events.append(event)
        self.log.warning("divergence at step %d: %s (loss %s, grad norm %s, ceiling %s): %s", step, kind, loss,
                         grad_norm, ceiling, verdict)
        if self.write is not None:
            self.write(event)
        return event

    def check(self, step: int, loss: float, grad_norm: float) -> None:
        """Judge step ``step`` (1-based) against :attr:`ceiling`, which is what the step was given:
        the history changes only here.

        Raises:
            Diverged: ``fail``; or ``rerun`` and the divergence repeated, or reruns are used up.
            Rerun: ``rerun`` and this step has not been rerun yet.
        """
        ceiling = self.ceiling
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        kind = None if finite and loss <= ceiling else ("non_finite" if not finite else "spike")
        if kind is None:
            if step in self.reruns:
                self._event(step, "rerun_clean", loss, grad_norm, ceiling,
                            "did not repeat after a rerun from a checkpoint: suspect the hardware")
            self.history.append(loss)
            return
        action = self.cfg.action
        if action == "skip":
            self._event(step, kind, loss, grad_norm, ceiling, "update skipped")
            return
        if action == "rerun" and step not in self.reruns and len(self.reruns) < self.cfg.max_reruns:
            self._event(step, kind, loss, grad_norm, ceiling, "rerun from the last checkpoint")
            self.reruns.add(step)
            raise Rerun(step)
        if action == "rerun":
            verdict = ("repeats after a rerun from a checkpoint on a deterministic trainer: the data or the model"
                       if step in self.reruns else f"reruns used up (max_reruns={self.cfg.max_reruns})")
        else:
            verdict = "training stopped"
        raise Diverged(self._event(step, kind, loss, grad_norm, ceiling, verdict))


def append_event(path: Any) -> Callable[[dict[str, Any]], None]:
    """A ``write`` for :class:`Guard` appending each event to ``path`` as a JSON line."""

    def write(event: dict[str, Any]) -> None:
        with open(path, "a") as out:
            out.write(json.dumps(event, sort_keys=True) + "\n")

    return write


__all__ = ["EVENTS", "Diverged", "Guard", "Rerun", "append_event"]
