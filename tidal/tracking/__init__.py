"""The one owner of tracking: MLflow (``tracker``), StatsD metrics (``statsd``) and the failure
catalog (``failures``). Nothing outside this package talks to MLflow directly.

The names most callers need are re-exported here: :mod:`tidal.tracking.tracker` (logging runs,
never raising; a step's datasets and logged models: :mod:`tidal.tracking.mlflow_lineage`) and
:mod:`tidal.tracking.runs` (finding, linking and closing runs; raises
:class:`TrackingUnavailable` when MLflow does not answer).
"""

from __future__ import annotations

from tidal.tracking.runs import (
    TrackedRun,
    child_runs,
    close_run,
    experiment_name,
    experiments_link,
    parent_run,
    parent_run_in_any_experiment,
    parent_runs_with_prefix,
    run_link,
    store_exists,
    ui_url,
    unreachable_message,
)
from tidal.tracking.tracker import (
    PENDING_PREFIX,
    RUN_KEY_TAG,
    STEP_TAG_PREFIX,
    Tracker,
    TrackingUnavailable,
    artifact_location_for,
    flatten_params,
    is_per_machine,
    mlflow_client,
    safe_uri,
    tracking_uri_for,
)

__all__ = ["PENDING_PREFIX", "RUN_KEY_TAG", "STEP_TAG_PREFIX", "TrackedRun", "Tracker", "TrackingUnavailable",
           "artifact_location_for", "child_runs", "close_run", "experiment_name", "experiments_link",
           "flatten_params", "is_per_machine",
           "mlflow_client", "parent_run", "parent_run_in_any_experiment", "parent_runs_with_prefix",
           "run_link", "safe_uri", "store_exists", "tracking_uri_for", "ui_url", "unreachable_message"]
