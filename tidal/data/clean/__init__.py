"""The ``clean`` step kind (``python -m tidal.data.clean``): ``step`` is the Beam pipeline and the
kind's ``run`` / ``summarize``; ``fns`` its DoFns and shard writers; ``record`` the per-record
rules; ``config`` the validated config. The kind's names are re-exported here.
"""

from tidal.data.clean.config import CleanConfig
from tidal.data.clean.step import (
    COUNTS_FILE,
    DOCUMENT_SCHEMA,
    QUARANTINE_FILE,
    REMOVED_FILE,
    STEP_VERSION,
    build_pipeline,
    check_counts,
    check_outputs,
    clean,
    counts_from_totals,
    flat_counts,
    run,
    shard_name,
    shard_of,
    summarize,
)

__all__ = ["COUNTS_FILE", "DOCUMENT_SCHEMA", "QUARANTINE_FILE", "REMOVED_FILE", "STEP_VERSION", "CleanConfig",
           "build_pipeline", "check_counts", "check_outputs", "clean", "counts_from_totals", "flat_counts", "run",
           "shard_name", "shard_of", "summarize"]
