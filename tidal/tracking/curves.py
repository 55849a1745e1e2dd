"""One MLflow run per train step holding its downstream eval results at each evaluated checkpoint.

The run (tag ``tidal.eval_curve`` = the train step id, run name ``eval-curve <train step id>``) has
one point per checkpoint step for each ``<task>/<metric>``, so MLflow draws task accuracy over training
steps. It is rebuilt from the bucket: the caller passes every committed eval result
(:func:`tidal.core.checkpoint_evals.curve_points`) and only the points the run does not hold yet are
logged, so a rerun, a retry or a run after an outage adds what is missing and never a point twice.
Nothing is buffered: what MLflow missed is logged by the next call.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tidal.tracking.client import TrackingUnavailable, safe_uri
from tidal.tracking.limits import MAX_METRICS_PER_BATCH, MAX_TAG_VALUE, _chunks, _is_number, _key, _text

CURVE_TAG = "tidal.eval_curve"
log = logging.getLogger("tidal.tracking")
__all__ = ["CURVE_TAG", "log_eval_curve"]


def log_eval_curve(tracker: Any, train_step_id: str, rows: list[dict[str, Any]],
                   tags: dict[str, str] | None = None) -> str | None:
    """Log ``rows`` (``{"step": checkpoint step, "<task>/<metric>": value}``) into the eval-curve run of
    ``train_step_id`` in ``tracker``'s experiment (a :class:`tidal.tracking.tracker.Tracker`), creating it.

    Returns:
        The run id, or None when MLflow did not answer (a warning is logged; nothing raised).
    """
    try:
        return _log(tracker, train_step_id, rows, dict(tags or {}))
    except TrackingUnavailable as err:
        log.warning("tracking: eval curve of %s not logged (%s); the next evaluation logs it", train_step_id,
                    safe_uri(str(err)))
        return None


def _log(tracker: Any, train_step_id: str, rows: list[dict[str, Any]], tags: dict[str, str]) -> str:
    from mlflow.entities import Metric

    client, retry = tracker._client(), tracker._retry
    exp = tracker._experiment()
    found = retry("find eval curve run", lambda: client.search_runs(
        [exp], filter_string=f"tags.`{CURVE_TAG}` = '{train_step_id}'", max_results=1,
        order_by=["attributes.start_time ASC"]))
    if found:
        run_id, have = found[0].info.run_id, found[0].data.metrics
    else:
        run_tags = {_key(k): _text(v, MAX_TAG_VALUE) for k, v in tags.items()}
        run_tags |= {CURVE_TAG: train_step_id, "tidal.kind": "eval_curve", "tidal.step_id": train_step_id}
        run_id = retry("create eval curve run", lambda: client.create_run(
            exp, tags=run_tags, run_name=f"eval-curve {train_step_id}")).info.run_id
        have = {}
    held = {key: {m.step for m in retry(f"read {key}", lambda k=key: client.get_metric_history(run_id, k))}
            for key in sorted(have)}
    now_ms = int(time.time() * 1000)
    metrics = [Metric(_key(k), float(v), now_ms, int(row["step"])) for row in rows for k, v in sorted(row.items())
               if k != "step" and _is_number(v) and int(row["step"]) not in held.get(_key(k), ())]
    for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
        retry("log eval curve", lambda c=chunk: client.log_batch(run_id, metrics=c))
    retry("finish eval curve run", lambda: client.set_terminated(run_id, "FINISHED"))
    log.info("tracking: eval curve of %s: %d new point(s) in run %s", train_step_id, len(metrics), run_id)
    return run_id
