"""The DAG arguments every tidal pipeline DAG shares (recipe DAGs and scaling-suite DAGs)."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import Param

from operators.callbacks import on_failure_callback
from operators.params import recipe_params

# Scheduled recipes need a start date for their timetable; runs before it are never created
# (catchup is off; `airflow backfill create` makes past runs on purpose).
SCHEDULE_START = datetime(2026, 1, 1, tzinfo=UTC)


def pipeline_dag_args(graph, recipe=None) -> dict:
    """DAG arguments every tidal pipeline DAG shares: one run at a time, failures recorded in
    the catalog (operators/callbacks.py), and the trigger form.

    With a ``recipe`` (tidal.recipe.Recipe): its ``schedule`` (None: manual trigger only) and the
    full form of operators/params.py (seed, training steps, launcher, resource profile, steps to
    force-rerun, dry run). Without (a scaling suite): manual, ``force_steps`` and ``dry_run`` only.
    """
    names = [s.name for s in graph]
    if recipe is not None:
        params = recipe_params(recipe, names)
    else:
        params = {
            "force_steps": Param([], type="array", items={"type": "string", "enum": names}, uniqueItems=True,
                                 description="steps to recompute even if committed"),
            "dry_run": Param(False, type="boolean", description="plan only: log run/skip/blocked, compute nothing"),
        }
    schedule = getattr(recipe, "schedule", None)
    args = {
        "schedule": schedule,
        "catchup": False,
        "max_active_runs": 1,
        "params": params,
        "default_args": {"on_failure_callback": on_failure_callback},
    }
    if schedule is not None:
        args["start_date"] = SCHEDULE_START
    return args
