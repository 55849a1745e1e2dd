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


def quiet_libraries(level: int = logging.WARNING) -> None:
    """Set the noisy library loggers to ``level`` (idempotent; cheap)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)
