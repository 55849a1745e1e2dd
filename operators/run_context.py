"""What a task knows about its DAG run: the MLflow run key, the run's pipeline (recipe plus the
run's overrides) and the signing key handed over from an Airflow connection."""

from __future__ import annotations

from typing import Any

from operators.params import overrides_from_params
from tidal.recipe import load_recipe
from tidal.scaling.suite import is_suite_file
from tidal.settings import current


def run_key_of(context: Any) -> str:
    """The MLflow parent-run key of the Airflow DAG run: ``{dag_id}__{run_id}``."""
    dag_run = context["dag_run"]
    return f"{dag_run.dag_id}__{dag_run.run_id}"


SIGNING_CONN_ID = "tidal_signing"


def export_signing_key(conn_id: str = SIGNING_CONN_ID) -> bool:
    """Export the Airflow connection ``tidal_signing``'s password (hex key) as ``$TIDAL_SIGNING_KEY``.

    tidal signs ``step.json`` and ``manifest.json`` with that variable (tidal/integrity/signing.py) and
    never imports Airflow, so the worker hands the secret over here, before the step commits.
    A variable already set wins; no connection means the step is committed unsigned.

    Returns:
        True when a key was exported from the connection.
    """
    import os

    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    if current().signing_key is not None:
        return False
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return False
    if not conn.password:
        return False
    os.environ["TIDAL_SIGNING_KEY"] = conn.password
    return True


class SharedTrackingRequired(RuntimeError):
    """An Airflow task of a pipeline whose storage root is shared by every pod (``s3://``) but whose
    MLflow store is a file on one machine (:meth:`tidal.core.pipeline.Pipeline.tracking_problem`)."""


def pipeline_for_run(recipe_path: str, context: Any, *, check_tracking: bool = True):
    """The :class:`tidal.core.pipeline.Pipeline` of this DAG run: the recipe with the run's overrides.

    Step ids are computed here, at run time, from the run's params (trigger conf merged over
    the form's defaults by Airflow), not at parse time: a run that overrides ``train_steps``
    computes (and commits) a different train step than the DAG's doc shows. A scaling suite
    takes no overrides.

    Args:
        check_tracking: refuse a pipeline that cannot run across pods as configured (the failure
            callback passes False so that it can still record that refusal).

    Raises:
        tidal.recipe.RecipeError: the recipe or an override is invalid.
        SharedTrackingRequired: an object-store root with a per-machine tracking store (SQLite,
            a file path, or unset): every task runs in its own pod, so set ``MLFLOW_TRACKING_URI``
            (or the recipe's ``tracking_uri``) to an MLflow server.
    """
    from tidal.core.load import load_pipeline

    if is_suite_file(recipe_path):
        pipe = load_pipeline(recipe_path)
    else:
        params = dict(context.get("params") or {})
        overrides = overrides_from_params(load_recipe(recipe_path), params)
        pipe = load_pipeline(recipe_path, overrides or None)
    problem = pipe.tracking_problem() if check_tracking else None
    if problem:
        raise SharedTrackingRequired(f"{problem}; Airflow runs every task in its own pod, so this task refuses "
                                     "to run rather than record into a store the other tasks never see")
    return pipe
