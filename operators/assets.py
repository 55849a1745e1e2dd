"""Airflow Assets of committed steps: every task that commits a step emits one asset event.

A step's URI is known only at run time (the run's overrides change step ids, and the storage root
is the worker's setting), so each committing task declares an asset *alias* as its outlet,
``tidal_<recipe>.<step>``, and adds to it, when the step was computed and committed by this task,
the event of the asset whose URI is the committed step's (``s3://bucket/prefix/<step id>/`` or
``file:///root/<step id>``) with ``extra`` = step id, manifest root hash, kind, recipe and run key.
A step found committed already (status ``skip``) emits nothing: nothing new exists, with one
exception: a retry (try 2 or later) that finds the step committed *after its DAG run started* emits
it, because the try that committed it was lost (its node died between the commit and the task's
success) and its event with it. Events are so at least once per committed step and DAG run.

Consumers (a DAG with ``schedule=checkpoint_alias(recipe)``) are triggered by those events, but
Airflow can merge events of tasks that finish together into one run of the consumer, so a
consumer must find the committed steps from storage (the bucket), not from its triggering events.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

__all__ = ["asset_uri", "checkpoint_alias", "emit_step_asset", "read_step_record", "step_alias"]


def step_alias(recipe_name: str, step_name: str) -> AssetAlias:
    """The asset alias a step's committing task adds its event to: ``tidal_<recipe>.<step>``."""
    return AssetAlias(name=f"tidal_{recipe_name}.{step_name}")


def checkpoint_alias(recipe_name: str, train_step: str = "train") -> AssetAlias:
    """The alias of a recipe's training step (its committed output holds the checkpoints)."""
    return step_alias(recipe_name, train_step)


def asset_uri(storage_uri: str) -> str:
    """A committed step's location as an Asset URI: object stores as they are (no trailing ``/``),
    a local path as ``file://`` + absolute path (Airflow keeps URIs without a scheme unnormalized)."""
    uri = storage_uri.rstrip("/")
    return uri if "://" in uri else f"file://{uri}"


def read_step_record(pipe: Any, step_id: str) -> dict[str, Any] | None:
    """The committed ``step.json`` of ``step_id`` under ``pipe``'s storage root (one read; one GET on
    S3), or None when it cannot be read or parsed."""
    import json

    try:
        return json.loads(pipe.storage.read_text(step_id, "step.json"))
    except (OSError, ValueError):
        return None


_UNREAD: Any = object()


def emit_step_asset(context: Any, pipe: Any, result: Any, run_key: str, log: Any,
                    record: dict[str, Any] | None = _UNREAD) -> dict[str, Any] | None:
    """Add the asset event of ``result``'s step to its alias, if this task committed it.

    Args:
        context: the task's Airflow context (``outlet_events``).
        pipe: the run's :class:`tidal.core.pipeline.Pipeline`.
        result: the step's :class:`tidal.core.commit.StepResult`.
        run_key: the MLflow run key of the DAG run.
        record: the step's ``step.json`` when the caller read it already (:func:`read_step_record`;
            None: unreadable); read here when not given.

    Returns:
        The event's ``{"uri", "extra"}``, or None when nothing was committed in this DAG run (a
        ``skip`` of a step committed before the run started, or any ``skip`` of a first try).
        Never raises for a missing record: the step is committed; its event is a WARNING on ``log``.
    """
    events = context.get("outlet_events")
    if events is None or (result.status != "run" and not _retry_of_this_run(context)):
        return None  # events None: called outside a task runner (no outlets)
    step = pipe.graph[result.name]
    if record is _UNREAD:
        record = read_step_record(pipe, step.step_id)
    if record is None:
        log.warning("asset event of %s not emitted: its step.json is unreadable", step.step_id)
        return None
    if result.status != "run" and not _committed_during(record, context):
        return None
    uri = asset_uri(pipe.storage.step_uri(step.step_id))
    extra = {"step_id": step.step_id, "step": step.name, "kind": step.kind, "recipe": pipe.recipe.name,
             "manifest_root_hash": record.get("manifest_root_hash"), "run_key": run_key}
    events[step_alias(pipe.recipe.name, step.name)].add(Asset(uri=uri, name=uri), extra=extra)
    log.info("asset event %s (%s, root %s)", uri, step.step_id, str(extra["manifest_root_hash"])[:12])
    return {"uri": uri, "extra": extra}


def _retry_of_this_run(context: Any) -> bool:
    """Whether the task runs its second or later try (an earlier try may have committed and died)."""
    ti = context.get("ti")
    return ti is not None and int(getattr(ti, "try_number", 1) or 1) > 1


def _committed_during(record: dict[str, Any], context: Any) -> bool:
    """Whether ``step.json``'s ``provenance.ended_at`` (ISO 8601, UTC) is at or after the DAG run's
    ``start_date``: the step was committed by this run (a lost earlier try), not found from before."""
    from datetime import datetime

    started = getattr(context.get("dag_run"), "start_date", None)
    ended = (record.get("provenance") or {}).get("ended_at")
    if started is None or not ended:
        return False
    try:
        return datetime.fromisoformat(ended) >= started
    except (TypeError, ValueError):
        return False
