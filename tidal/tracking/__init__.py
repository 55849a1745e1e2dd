"""The one owner of tracking: MLflow (``tracker``), StatsD metrics (``statsd``) and the failure
catalog (``failures``). Nothing outside this package talks to MLflow directly.

The names most callers need are re-exported here from :mod:`tidal.tracking.tracker`.
"""

from __future__ import annotations

from tidal.tracking.tracker import (
    PENDING_PREFIX,
    RUN_KEY_TAG,
    STEP_TAG_PREFIX,
    Tracker,
    TrackingUnavailable,
    artifact_location_for,
    flatten_params,
    tracking_uri_for,
)

__all__ = ["PENDING_PREFIX", "RUN_KEY_TAG", "STEP_TAG_PREFIX", "Tracker", "TrackingUnavailable",
           "artifact_location_for", "flatten_params", "tracking_uri_for"]
