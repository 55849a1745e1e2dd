"""Task callbacks of tidal DAGs: record each failure in the catalog, count it, alert on it.

``on_failure_callback`` (set through ``default_args`` in operators/dag_factory.py) runs in the
task's own process after the task failed, with the task's context: the exception object
(a :class:`tidal.quality.gates.GateFailed` keeps its failed expectations), the task, the try number.
It must never raise: whatever part fails (MLflow down, storage read-only) is logged and the
rest still happens.

The log tail is the end of the attempt's Airflow log file (:func:`task_log_tail`); when that
file is not on this machine, the lines logged in this process (:func:`capture_log_tail` attaches
a :class:`tidal.tracking.failures.LogTail` ring buffer to the root logger when a tidal task starts).
"""

from __future__ import annotations

import logging
from typing import Any

from operators.run_context import pipeline_for_run, run_key_of
from operators.task_log import capture_log_tail, log_tail, task_log_tail

log = logging.getLogger(__name__)
__all__ = ["capture_log_tail", "failure_record", "log_tail", "mlflow_link", "on_failure_callback", "task_log_tail"]
def mlflow_link(pipe: Any, run_key: str) -> tuple[str | None, str | None]:
    """``(parent run id, link)`` of the DAG run's MLflow parent run; ``(None, None)`` if not found.

    The link uses ``TIDAL_MLFLOW_UI_URL`` (the MLflow server's browser URL), else the tracking
    URI when it is http(s); a SQLite store has no UI, so its link is the ``runs:/`` URI
    (:func:`tidal.tracking.run_link`).

    Raises:
        tidal.tracking.TrackingUnavailable: MLflow does not answer.
    """
    from tidal.tracking import parent_run, run_link

    run = parent_run(pipe.tracking_uri, pipe.experiment, run_key)
    if run is None:
        return None, None
    return run.run_id, run_link(pipe.tracking_uri, run)


def failure_record(context: Any) -> tuple[dict[str, Any], Any]:
    """The catalog record of a failed task and its pipeline (None if the recipe cannot load)."""
    from tidal.tracking.failures import build_record

    ti, task, dag_run = context["ti"], context["task"], context["dag_run"]
    exc = context.get("exception")
    if not isinstance(exc, BaseException):
        exc = RuntimeError(str(exc) if exc else "task failed without an exception (killed or timed out?)")
    fields: dict[str, Any] = {
        "dag_id": dag_run.dag_id, "task_id": ti.task_id, "run_id": dag_run.run_id,
        "map_index": getattr(ti, "map_index", -1), "try_number": getattr(ti, "try_number", None),
    }
    try:
        fields["log_tail"] = task_log_tail(dag_run.dag_id, dag_run.run_id, ti.task_id, fields["try_number"],
                                           fields["map_index"]) or log_tail()
    except Exception as err:  # noqa: BLE001 - a missing log is not worth losing the record
        log.warning("failure record: task log not readable: %s", err)
        fields["log_tail"] = log_tail()
    pipe = None
    recipe_path = getattr(task, "recipe_path", None)
    if recipe_path:
        try:
            pipe = pipeline_for_run(recipe_path, context, check_tracking=False)  # record even that refusal
            fields.update(recipe=pipe.recipe.name, recipe_hash=pipe.recipe_hash)
            step_name = getattr(task, "step_name", None) or ti.task_id.split(".")[0]
            if step_name in pipe.graph.by_name:
                fields.update(step_name=step_name, step_id=pipe.graph[step_name].step_id,
                              step_kind=pipe.graph[step_name].kind)
        except Exception as err:  # noqa: BLE001 - a broken recipe is itself the failure to record
            log.warning("failure record: recipe %s did not load: %s", recipe_path, err)
    if pipe is not None:
        from tidal.tracking import TrackingUnavailable

        try:
            fields["mlflow_run_id"], fields["mlflow_link"] = mlflow_link(pipe, run_key_of(context))
        except TrackingUnavailable as err:  # tracking never takes a callback down
            fields["mlflow_run_id"] = fields["mlflow_link"] = None
            log.warning("failure record: %s; recorded without MLflow run id and link", err)
        except Exception as err:  # noqa: BLE001 - tracking never takes a callback down
            log.warning("failure record: MLflow lookup failed: %s", err)
    return build_record(exc, **fields), pipe


def on_failure_callback(context: Any) -> None:
    """Record the failure as an object ``{storage_root}/failures/...`` (in the bucket for an object-store
    root, so every pod sees it), send metrics and the webhook alert;
    close a GKE training step's live MLflow run as FAILED (:func:`operators.remote.close_failed_live_run`)."""
    from tidal.tracking import TrackingUnavailable

    try:
        from operators.remote import close_failed_live_run

        closed = close_failed_live_run(context)
        if closed:
            log.info("live MLflow run %s of the failed step marked FAILED", closed)
    except TrackingUnavailable as err:
        log.warning("tidal failure callback: the step's live MLflow run stays open: %s", err)
    except Exception:
        log.exception("tidal failure callback could not close the step's live MLflow run")
    if getattr(context.get("exception"), "tidal_derived", False):  # the report of a run whose step failed:
        log.info("tidal failure callback: a derived failure (its cause is recorded by the failed step's own task)")
        return  # no second catalog entry, counter or alert for the same cause
    try:
        record, pipe = failure_record(context)
    except Exception:
        log.exception("tidal failure callback could not build a record")
        return
    if pipe is not None:
        try:
            from tidal.tracking.failures import record_failure

            path = record_failure(pipe.storage, record)
            log.info("failure %s recorded in %s", record["fingerprint"], path)
        except Exception:
            log.exception("tidal failure callback could not write the catalog")
    try:
        from tidal.tracking import statsd as m

        client = m.StatsdClient.from_env()
        tags = {"recipe": str(record.get("recipe")), "step": str(record.get("task_id")),
                "kind": str(record.get("step_kind"))}
        client.incr(m.STEP_FAILED, tags=tags)
        if record["failed_expectations"]:
            client.incr(m.GATE_FAILED, tags=tags)
        client.close()
    except Exception:
        log.exception("tidal failure callback could not send metrics")
    from operators.alerts import send_alert

    send_alert(record)
