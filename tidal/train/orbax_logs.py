"""One failed checkpoint save, one line: orbax's own ERROR records of a failed save are kept out of the log.

Why: when a save fails (a full disk, a read-only directory), orbax logs the same exception from each of
its threads through absl, each with its whole traceback: the signalling threads, the commit, the
finalize thread and ``wait_until_finished`` (5 records and about 450 lines for one full disk, issue 43
item 8). The trainer already reports that failure in one ``error:`` line naming the checkpoint and
the cause (:class:`tidal.train.checkpoints.CheckpointSaveFailed`), so these records are dropped; each is
counted in :data:`dropped` and its first line kept at DEBUG on ``tidal.train.checkpoints``. Records
from anywhere but orbax's checkpoint package, and orbax's records below ERROR, pass unchanged.
"""

from __future__ import annotations

import logging

ORBAX_PATH = "/orbax/checkpoint/"
log = logging.getLogger("tidal.train.checkpoints")
dropped = 0  # orbax ERROR records with a traceback kept out of the log by this process


class _FailedSaveRecords(logging.Filter):
    """Drops orbax's ERROR records that carry a traceback (the failed save's repeats)."""

    def filter(self, record: logging.LogRecord) -> bool:
        global dropped
        if record.levelno < logging.ERROR or ORBAX_PATH not in (record.pathname or "") or not record.exc_info:
            return True
        dropped += 1
        log.debug("orbax (kept out of the log; the save's error line names the cause): %s",
                  record.getMessage().splitlines()[0][:300])
        return False


_FILTER = _FailedSaveRecords()


def quiet_failed_saves() -> None:
    """Install the filter on the ``absl`` logger orbax logs through (idempotent)."""
    absl = logging.getLogger("absl")
    if _FILTER not in absl.filters:
        absl.addFilter(_FILTER)


__all__ = ["quiet_failed_saves"]
