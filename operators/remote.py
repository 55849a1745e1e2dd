"""The operators of a step computed outside the Airflow worker: prepare -> launch -> commit.

A step that runs elsewhere (a training Pod or JobSet on GKE, :mod:`operators.gke`; a Beam job through
the Beam provider, :mod:`operators.beam`) is a task group of three operators; their bases live here:

* :class:`TidalPrepareOperator` (branch): :func:`tidal.core.remote.prepare`; a committed step goes
  straight to ``commit``, otherwise the launch runs. For a training pod it also opens the step's live
  MLflow run (:func:`open_live_run`; XComs ``mlflow_tracking_uri`` / ``mlflow_run_id``), which
  :func:`close_failed_live_run` marks FAILED when another task of the group fails.
* :class:`ProviderOperator`: a DAG-file shell that keeps a provider operator's arguments (templated)
  and builds the real operator on the worker, so that parsing the DAG never imports the provider
  (the cncf-kubernetes provider costs seconds: the ``kubernetes`` and ``kubernetes_asyncio`` clients).
* :class:`TidalCommitOperator`: :func:`tidal.core.remote.commit` writes manifest, step.json, _SUCCESS
  and records the step in MLflow (into the live run when prepare opened one).

:mod:`operators.beam` subclasses prepare and commit (:func:`tidal.core.beam_job.prepare` / ``commit``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.bases.branch import BaseBranchOperator

from operators.openlineage_facets import StepLineageMixin
from operators.run_context import export_signing_key, pipeline_for_run, run_key_of
from tidal.settings import MLFLOW_RUN_ID_ENV as RUN_ID_ENV
from tidal.settings import TRACKING_URI_ENV as URI_ENV

# XCom keys of the prepare task read by the pod env templates and by commit
XCOM_TRACKING_URI, XCOM_RUN_ID = "mlflow_tracking_uri", "mlflow_run_id"


class ProviderOperator(BaseOperator):
    """A DAG-file shell for a provider operator that is built and run on the worker.

    Args:
        provider_class: ``"module:Class"`` of the provider operator.
        operator_kwargs: its keyword arguments; templated (rendered before it is built).

    ``execute`` builds the operator with the rendered arguments and runs it with the same
    context; a deferral it raises defers this task, and ``resume_execution`` hands the
    trigger's event back to a freshly built operator (e.g. ``trigger_reentry``).
    """

    template_fields: Sequence[str] = ("operator_kwargs",)
    ui_color = "#d9f2d9"

    def __init__(self, *, provider_class: str, operator_kwargs: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.provider_class = provider_class
        self.operator_kwargs = operator_kwargs
        self._built: BaseOperator | None = None

    def build(self) -> BaseOperator:
        """The provider operator, built from the (rendered) arguments; imports the provider."""
        module, _, name = self.provider_class.partition(":")
        cls = getattr(importlib.import_module(module), name)
        self._built = cls(task_id=self.task_id, **self.operator_kwargs)
        return self._built

    def execute(self, context: Any) -> Any:
        return self.build().execute(context)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        return self.build().resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        if self._built is not None:
            self._built.on_kill()


class TidalPrepareOperator(BaseBranchOperator):
    """Branch: skip to ``commit`` when the step is committed, else check that the train step fits its
    accelerator (:func:`tidal.train.preflight.preflight`: failed without retry, before any pod, when it does
    not), write ``spec.json`` and launch.

    XCom ``prepared`` = :func:`tidal.core.remote.prepare`'s dict; ``step_uri`` = where the pod finds
    ``spec.json`` (on an object-store root the step's staging URI in the bucket, never a worker path);
    ``mlflow_tracking_uri`` / ``mlflow_run_id`` = the live run for the pod (:func:`open_live_run`;
    empty strings when there is none).
    """

    template_fields = ("recipe_path",)
    ui_color = "#cfe8ff"

    def __init__(self, *, recipe_path: str, step_name: str, launch_task_id: str, commit_task_id: str,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path, self.step_name = recipe_path, step_name
        self.launch_task_id, self.commit_task_id = launch_task_id, commit_task_id

    def choose_branch(self, context: Any) -> list[str]:
        from airflow.sdk.exceptions import AirflowFailException

        from tidal.core.remote import prepare
        from tidal.train.preflight import SizingRefused

        params = context.get("params") or {}
        force = self.step_name in (params.get("force_steps") or [])
        pipe = pipeline_for_run(self.recipe_path, context)
        try:
            prepared = prepare(pipe, self.step_name, force=force)
        except SizingRefused as err:  # no pod: a retry would be refused the same way
            raise AirflowFailException(f"error: {err}") from None
        if "sizing" in prepared:
            self.log.info("sized %s: %s", self.step_name, prepared["sizing"])
        live = open_live_run(pipe, self.step_name, run_key_of(context), self.log) if prepared["status"] == "run" else {}
        ti = context["ti"]
        ti.xcom_push(key="prepared", value=prepared)
        ti.xcom_push(key="step_uri", value=prepared["step_uri"])
        ti.xcom_push(key=XCOM_TRACKING_URI, value=live.get(URI_ENV, ""))
        ti.xcom_push(key=XCOM_RUN_ID, value=live.get(RUN_ID_ENV, ""))
        self.log.info("%s %s -> %s", prepared["status"], prepared["step_id"], prepared["step_uri"])
        if prepared["status"] == "skip":
            return [self.commit_task_id]
        return [self.launch_task_id, self.commit_task_id]


def open_live_run(pipe: Any, step_name: str, run_key: str, log: Any) -> dict[str, str]:
    """Open the MLflow run a training pod logs into while it trains; the pod's env for it.

    Args:
        pipe: the run's :class:`tidal.core.pipeline.Pipeline` (its ``tracking_uri``:
            ``$MLFLOW_TRACKING_URI`` of the deployment when set, else the recipe's, else the
            storage root's SQLite).
        step_name: the training step, about to be launched.
        run_key: the DAG run's MLflow parent-run key.
        log: logger for the one line saying why there is no live run.

    Returns:
        :func:`tidal.launch.pods.live_metrics_env`: both variables, or ``{}`` when the tracking
        URI is no server a pod can reach (nothing is opened; the step's run is created when it
        commits, as for a local run) or MLflow is unreachable now (the tracker warns).
    """
    from tidal.launch.pods import live_metrics_env, pod_tracking_uri, uri_scheme

    uri = pipe.tracking_uri
    if pod_tracking_uri(uri) is None:  # logged by scheme only: the rest may hold a password
        log.info("no live metrics for step %s: its tracking store (%s) is not an http(s) MLflow server a pod can "
                 "reach (tidal.launch.pods.pod_tracking_uri); the step's MLflow run is recorded when it commits",
                 step_name, uri_scheme(uri))
        return {}
    step = pipe.graph[step_name]
    parent = pipe.parent_run(run_key)
    run_id = pipe.tracker().open_step_run(parent, step.name, step.step_id, step.kind) if parent else None
    return live_metrics_env(uri, run_id)


def close_failed_live_run(context: Any) -> str | None:
    """Mark FAILED the live MLflow run ``{step}.prepare`` opened, when another task of the step's
    group failed (the pod never started or died, the JobSet sensor timed out, commit found no
    ``summary.json``); called by :func:`operators.callbacks.on_failure_callback`.

    Without it the run stayed RUNNING on the dashboards until a rerun of prepare reused it. A
    cleared and rerun launch logs into the same run (its id is prepare's XCom) and commit
    completes it (FINISHED); a rerun of prepare opens a new one (it reuses RUNNING runs only).

    Returns:
        The run id closed, or None: not a task of a GKE training step, no live run (the
        tracking store is no server a pod reaches), or the run is no longer RUNNING.

    Raises:
        tidal.tracking.TrackingUnavailable: MLflow does not answer (the callback warns and goes on).
    """
    ti, task = context["ti"], context["task"]
    group, _, leaf = ti.task_id.rpartition(".")
    prepare_id = f"{group}.prepare"
    if not group or leaf == "prepare" or prepare_id not in task.dag.task_dict:
        return None
    run_id = ti.xcom_pull(task_ids=prepare_id, key=XCOM_RUN_ID)
    uri = ti.xcom_pull(task_ids=prepare_id, key=XCOM_TRACKING_URI)
    if not run_id or not uri:
        return None
    from tidal.tracking import close_run

    return run_id if close_run(uri, run_id, "FAILED", tags={"tidal.status": "failed"}) else None


class TidalCommitOperator(StepLineageMixin, BaseOperator):
    """Commit the step after its pods succeeded (or confirm it was committed already)."""

    template_fields = ("recipe_path",)
    ui_color = "#cfe8ff"

    def __init__(self, *, recipe_path: str, step_name: str, prepare_task_id: str, workload: str,
                 **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_failed_min_one_success")
        super().__init__(**kwargs)
        self.recipe_path, self.step_name = recipe_path, step_name
        self.prepare_task_id, self.workload = prepare_task_id, workload

    def execute(self, context: Any) -> dict[str, Any]:
        from tidal.core.remote import commit

        export_signing_key()  # the commit signs step.json and manifest.json (tidal/integrity/signing.py)
        ti = context["ti"]
        prepared = ti.xcom_pull(task_ids=self.prepare_task_id, key="prepared")
        live_run = ti.xcom_pull(task_ids=self.prepare_task_id, key=XCOM_RUN_ID) or None
        pipe = pipeline_for_run(self.recipe_path, context)
        result = commit(pipe, self.step_name, started_at=prepared["started_at"], launcher="gke",
                        workload=self.workload, run_key=None, sizing=prepared.get("sizing"))
        # recorded here, not by commit(), so that the pod's live run is completed, not duplicated
        pipe.record(result, run_key_of(context), live_run=live_run, complete_history=True)
        self.log.info("%s %s in %.3f s -> %s", result.status, result.step_id, result.seconds, result.out_dir)
        self.announce_step(context, pipe, result, run_key_of(context))
        return {"step_id": result.step_id, "status": result.status, "seconds": round(result.seconds, 3)}


__all__ = ["RUN_ID_ENV", "URI_ENV", "XCOM_RUN_ID", "XCOM_TRACKING_URI", "ProviderOperator", "TidalCommitOperator",
           "TidalPrepareOperator", "close_failed_live_run", "open_live_run"]
