"""Keep step logs readable: turn down libraries that log routine internals at INFO.

Seen on a tiny-recipe run: 214 of 507 lines were Great Expectations'
``_docs_decorators`` registering closures and 192 were Beam's "Converting string literal
type hint to Any". Warnings and errors from those libraries still come through.
"""

from __future__ import annotations

import logging

NOISY_LOGGERS = (
    "great_expectations",
    "apache_beam.typehints",
    "apache_beam.runners.portability",
    "apache_beam.runners.worker",
    "alembic",
)


# Beam's DoFn runner logs a failing element's traceback at ERROR, then raises the same error with the
# transform's name added ("[while running 'X']"): the raised error is what the caller reports (one
# `error:` line for a user's mistake or a full disk); the logged copy was a second, 30-line traceback.
DUPLICATE_ERROR_LOGGERS = ("apache_beam.runners.common",)

# urllib3 logs one WARNING per HTTP retry (MLflow's client retries twice, tidal.tracking.HTTP_DEFAULTS):
# during a tracking outage that is two lines per call before tidal's own one-line message.
RETRY_LOGGERS = ("urllib3.connectionpool",)


# Records of the root logger that are known noise, by the start of their message: Beam imports its optional
# BigQuery client at `import apache_beam` and, without apitools (tidal never uses BigQuery), warns on the root
# logger in every process that runs a Beam step.
KNOWN_NOISE = ("apitools not found, and bigquery client libraries are not available",)


class _KnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(KNOWN_NOISE))


_NOISE_FILTER = _KnownNoise()


def drop_known_noise() -> None:
    """Drop :data:`KNOWN_NOISE` from the root logger (idempotent; installed when :mod:`tidal` is imported, so
    before any Beam import)."""
    if _NOISE_FILTER not in logging.getLogger().filters:
        logging.getLogger().addFilter(_NOISE_FILTER)


def quiet_libraries(level: int = logging.WARNING) -> None:
    """Set the noisy library loggers to ``level`` and urllib3's retry notices to ERROR (idempotent; cheap)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for name in RETRY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.ERROR))
    for name in DUPLICATE_ERROR_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    drop_known_noise()
