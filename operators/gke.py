"""The training step on GKE: prepare -> launch (Pod, or JobSet + sensor + delete) -> commit.

With ``train.resources.launcher: gke`` the DAG factory puts a task group named like the step
in place of the single ``TidalStepOperator``:

* ``{step}.prepare`` (branch; under a second, seconds when MLflow is slow to answer):
  :func:`tidal.core.remote.prepare`; a committed step goes straight to ``commit`` and no pod starts;
  otherwise ``spec.json`` is written, the step's MLflow run is opened (:func:`open_live_run`) and the launch runs.
* single pod (CPU, GPU node, single-host TPU slice): ``{step}.launch``, a
  ``KubernetesPodOperator`` with the manifest of :func:`tidal.launch.pods.pod_manifest`.
* several pods (multi-host TPU, multislice, multi-node GPU): ``{step}.create`` creates the
  JobSet of :func:`tidal.launch.pods.jobset`, ``{step}.wait`` (:class:`JobSetSensor`) waits
  for its ``Completed`` / ``Failed`` condition, ``{step}.delete`` removes it whatever the sensor
  found (it does not run when create was skipped: ``trigger_rule="none_skipped"``).
* ``{step}.commit``: :func:`tidal.core.remote.commit` writes manifest, step.json, _SUCCESS,
  and the step is recorded in MLflow: into the live run when prepare opened one.

Live metrics: prepare pushes XComs ``mlflow_tracking_uri`` and ``mlflow_run_id``; the pod env
takes ``MLFLOW_TRACKING_URI`` / ``TIDAL_MLFLOW_RUN_ID`` from them by templating, as it takes
its step URI. Both are empty (the trainer then logs nothing live) unless the recipe's or the
deployment's tracking URI is an MLflow server a pod can reach
(:func:`tidal.launch.pods.pod_tracking_uri`) and the run could be opened.

Parsing stays light: importing the cncf-kubernetes provider costs seconds (the ``kubernetes``
and ``kubernetes_asyncio`` clients), so the DAG holds :class:`ProviderOperator` shells that
keep the provider operator's arguments (templated) and build the real operator on the worker.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator, TaskGroup
from airflow.sdk.bases.branch import BaseBranchOperator

from operators.assets import step_alias
from operators.lineage import StepLineageMixin
from operators.run_context import run_key_of
from tidal.settings import MLFLOW_RUN_ID_ENV as RUN_ID_ENV
from tidal.settings import TRACKING_URI_ENV as URI_ENV

POD_OPERATOR = "airflow.providers.cncf.kubernetes.operators.pod:KubernetesPodOperator"
CREATE_OPERATOR = "airflow.providers.cncf.kubernetes.operators.resource:KubernetesCreateResourceOperator"
DELETE_OPERATOR = "airflow.providers.cncf.kubernetes.operators.resource:KubernetesDeleteResourceOperator"
CONN_ID = "kubernetes_default"
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# How often the deferred pod operator comes back to a worker to fetch new log lines (s).
LOG_INTERVAL_S = 120
# XCom keys of the prepare task read by the pod env templates and by commit
XCOM_TRACKING_URI, XCOM_RUN_ID = "mlflow_tracking_uri", "mlflow_run_id"
# TPU / GPU node pools scale up from zero: node provisioning plus a multi-GB image pull.
SCHEDULE_TIMEOUT_S = 3600
STARTUP_TIMEOUT_S = 1200


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
    """Branch: skip to ``commit`` when the step is committed, else write ``spec.json`` and launch.

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
        from operators.run_context import pipeline_for_run
        from tidal.core.remote import prepare

        params = context.get("params") or {}
        force = self.step_name in (params.get("force_steps") or [])
        pipe = pipeline_for_run(self.recipe_path, context)
        prepared = prepare(pipe, self.step_name, force=force)
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
        from operators.run_context import export_signing_key, pipeline_for_run
        from tidal.core.remote import commit

        export_signing_key()  # the commit signs step.json and manifest.json (tidal/integrity/signing.py)
        ti = context["ti"]
        prepared = ti.xcom_pull(task_ids=self.prepare_task_id, key="prepared")
        live_run = ti.xcom_pull(task_ids=self.prepare_task_id, key=XCOM_RUN_ID) or None
        pipe = pipeline_for_run(self.recipe_path, context)
        result = commit(pipe, self.step_name, started_at=prepared["started_at"], launcher="gke",
                        workload=self.workload, run_key=None)
        # recorded here, not by commit(), so that the pod's live run is completed, not duplicated
        pipe.record(result, run_key_of(context), live_run=live_run, complete_history=True)
        self.log.info("%s %s in %.3f s -> %s", result.status, result.step_id, result.seconds, result.out_dir)
        self.announce_step(context, pipe, result, run_key_of(context))
        return {"step_id": result.step_id, "status": result.status, "seconds": round(result.seconds, 3)}


class JobSetSensor(BaseSensorOperator):
    """Wait for a JobSet to finish: True on its ``Completed`` condition, fail on ``Failed``.

    Runs in ``reschedule`` mode (the worker slot is free between pokes); JobSet itself restarts
    all workers on a failure up to ``failurePolicy.maxRestarts``, so ``Failed`` is final.
    """

    template_fields = ("name", "namespace")

    def __init__(self, *, name: str, namespace: str, kubernetes_conn_id: str = CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.name, self.namespace, self.kubernetes_conn_id = name, namespace, kubernetes_conn_id

    def poke(self, context: Any) -> bool:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from airflow.sdk.exceptions import AirflowFailException

        hook = KubernetesHook(conn_id=self.kubernetes_conn_id)
        obj = hook.get_custom_object(group=JOBSET_GROUP, version=JOBSET_VERSION, plural=JOBSET_PLURAL,
                                     name=self.name, namespace=self.namespace)
        return jobset_finished(obj, AirflowFailException)


def jobset_finished(obj: dict[str, Any], failure: type[Exception] = RuntimeError) -> bool:
    """True when a JobSet object's status has ``Completed=True``; raises ``failure`` on ``Failed=True``."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    if "Failed" in conditions:
        raise failure(f"JobSet {obj['metadata']['name']} failed after {status.get('restarts', 0)} restarts: "
                      f"{conditions['Failed'].get('message', '')}")
    return "Completed" in conditions


def gke_train_group(*, step: Any, recipe: Any, recipe_path: str) -> TaskGroup:
    """The task group that runs one training ``step`` on GKE (call inside a ``DAG`` context).

    Args:
        step: the planned :class:`tidal.steps.Step` (its id names the workload and labels it).
        recipe: the loaded :class:`tidal.recipe.Recipe` (``train.resources`` says where).
        recipe_path: the recipe file the tasks reload on the worker.

    The pods also get the deployment's secrets named by ``$TIDAL_POD_SECRET_ENV``
    (:func:`tidal.launch.pods.pod_secret_env`, e.g. an MLflow token), through ``secretKeyRef``.

    Raises:
        tidal.launch.pods.SpecError: a bad ``$TIDAL_POD_SECRET_ENV`` (the DAG fails to import,
            naming the variable and the entry).
    """
    import yaml

    from tidal.launch.pods import is_single_pod, pod_secret_env, storage_env, workload
    from tidal.settings import current as current_settings

    resources = recipe.train.resources
    name = f"tidal-{step.step_id}"
    labels = {"tidal.dev/recipe": recipe.name, "tidal.dev/step": step.name, "tidal.dev/step-id": step.step_id}
    with TaskGroup(group_id=step.name, tooltip=f"step {step.step_id} on GKE") as group:
        prefix = f"{step.name}."
        step_uri = f'{{{{ ti.xcom_pull(task_ids="{prefix}prepare", key="step_uri") }}}}'
        live_env = {env: f'{{{{ ti.xcom_pull(task_ids="{prefix}prepare", key="{key}") or "" }}}}'
                    for env, key in ((URI_ENV, XCOM_TRACKING_URI), (RUN_ID_ENV, XCOM_RUN_ID))}
        settings = current_settings()
        where = storage_env(settings.storage_root or recipe.storage_root,
                            settings.s3_endpoint_url or recipe.storage.endpoint_url, recipe.storage.region)
        manifest = workload(resources, name=name, step_uri=step_uri, labels=labels, env={**where, **live_env},
                            secret_env=pod_secret_env(settings.pod_secret_env))
        single = is_single_pod(resources)
        launch_id = f"{prefix}launch" if single else f"{prefix}create"
        prepare = TidalPrepareOperator(task_id="prepare", recipe_path=recipe_path, step_name=step.name,
                                       launch_task_id=launch_id, commit_task_id=f"{prefix}commit")
        commit = TidalCommitOperator(task_id="commit", recipe_path=recipe_path, step_name=step.name,
                                     prepare_task_id=f"{prefix}prepare", workload=name,
                                     outlets=[step_alias(recipe.name, step.name)])
        if single:
            launch = ProviderOperator(task_id="launch", provider_class=POD_OPERATOR,
                                      operator_kwargs=pod_operator_kwargs(manifest))
            prepare >> launch >> commit
        else:
            body = yaml.safe_dump(manifest, sort_keys=False)
            common = {"yaml_conf": body, "namespace": resources.namespace, "custom_resource_definition": True,
                      "kubernetes_conn_id": CONN_ID}
            create = ProviderOperator(task_id="create", provider_class=CREATE_OPERATOR, operator_kwargs=common)
            restarts = resources.max_restarts + 1
            wait = JobSetSensor(task_id="wait", name=name, namespace=resources.namespace, poke_interval=60,
                                timeout=resources.deadline_seconds * restarts + SCHEDULE_TIMEOUT_S)
            delete = ProviderOperator(task_id="delete", provider_class=DELETE_OPERATOR, operator_kwargs=common,
                                      trigger_rule="none_skipped")
            prepare >> create >> wait >> delete >> commit
            wait >> commit
        prepare >> commit
    return group


def pod_operator_kwargs(manifest: dict[str, Any]) -> dict[str, Any]:
    """``KubernetesPodOperator`` arguments for a single-pod manifest; each choice on purpose.

    * ``pod_template_dict``: the whole hardened pod; the named arguments below repeat the
      fields the operator would otherwise overwrite with its own defaults.
    * ``on_finish_action="delete_succeeded_pod"``: a failed pod stays for ``kubectl describe``
      and its logs (a terminated pod holds no accelerator); a succeeded one is removed.
    * ``durable=True`` (Airflow 3.3's successor of ``reattach_on_restart``): if the worker dies,
      the next try reattaches to the running pod instead of starting a second training run.
    * ``get_logs=True`` with ``logging_interval``: training output streams into the task log.
    * ``deferrable=True``: hours of training wait in the triggerer, not in a worker slot.
    """
    spec = manifest["spec"]
    container = spec["containers"][0]
    return {
        "kubernetes_conn_id": CONN_ID,
        "namespace": manifest["metadata"]["namespace"],
        "name": manifest["metadata"]["name"],
        "labels": manifest["metadata"]["labels"],
        "image": container["image"],
        "cmds": container["command"],
        "arguments": container["args"],
        "base_container_name": container["name"],
        "pod_template_dict": manifest,
        "service_account_name": spec["serviceAccountName"],
        "automount_service_account_token": False,
        "termination_message_policy": container["terminationMessagePolicy"],
        "termination_grace_period": spec["terminationGracePeriodSeconds"],
        "active_deadline_seconds": spec["activeDeadlineSeconds"],
        "on_finish_action": "delete_succeeded_pod",
        "durable": True,
        "get_logs": True,
        "logging_interval": LOG_INTERVAL_S,
        "deferrable": True,
        "schedule_timeout_seconds": SCHEDULE_TIMEOUT_S,
        "startup_timeout_seconds": STARTUP_TIMEOUT_S,
        "log_events_on_failure": True,
    }


__all__ = ["JobSetSensor", "ProviderOperator", "TidalCommitOperator", "TidalPrepareOperator",
           "gke_train_group", "jobset_finished", "open_live_run", "pod_operator_kwargs"]
