"""The training step on GKE: prepare -> launch (Pod, or JobSet + sensor + delete) -> commit.

With ``train.resources.launcher: gke`` the DAG factory puts a task group named like the step
in place of the single ``TidalStepOperator``:

* ``{step}.prepare`` (branch; under a second, seconds when MLflow is slow to answer):
  :func:`tidal.core.remote.prepare`; a committed step goes straight to ``commit`` and no pod starts;
  otherwise ``spec.json`` is written, the step's MLflow run is opened
  (:func:`operators.remote.open_live_run`) and the launch runs.
* single pod (CPU, GPU node, single-host TPU slice): ``{step}.launch``, a
  ``KubernetesPodOperator`` with the manifest of :func:`tidal.launch.pods.pod_manifest`
  (:class:`PodLaunchOperator`: a pod that ends badly fails the task with its cause,
  :mod:`operators.pod_failures`: OOMKilled is not retried, evicted / preempted / node lost are).
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
and ``kubernetes_asyncio`` clients), so the DAG holds :class:`operators.remote.ProviderOperator` shells that
keep the provider operator's arguments (templated) and build the real operator on the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, TaskGroup
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from operators.assets import step_alias
from operators.remote import (
    RUN_ID_ENV,
    URI_ENV,
    XCOM_RUN_ID,
    XCOM_TRACKING_URI,
    ProviderOperator,
    TidalCommitOperator,
    TidalPrepareOperator,
)
from tidal.settings import current as current_settings

POD_OPERATOR = "airflow.providers.cncf.kubernetes.operators.pod:KubernetesPodOperator"
CREATE_OPERATOR = "airflow.providers.cncf.kubernetes.operators.resource:KubernetesCreateResourceOperator"
DELETE_OPERATOR = "airflow.providers.cncf.kubernetes.operators.resource:KubernetesDeleteResourceOperator"
CONN_ID = "kubernetes_default"
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# How often the deferred pod operator comes back to a worker to fetch new log lines (s).
LOG_INTERVAL_S = 120
# TPU / GPU node pools scale up from zero: node provisioning plus a multi-GB image pull.
SCHEDULE_TIMEOUT_S = 3600
STARTUP_TIMEOUT_S = 1200


class PodLaunchOperator(ProviderOperator):
    """The training pod's ``KubernetesPodOperator`` (built on the worker, :class:`ProviderOperator`); when it
    fails, the pod is read back and the failure re-raised as the pod's cause (:func:`operators.pod_failures.explain`:
    ``PodOOMKilled`` fails at once, ``PodEvicted`` / ``PodPreempted`` / ``PodNodeLost`` are retried), with the
    provider's error as its ``__cause__``. ``step_uri`` (templated) is where the trainer's metrics are."""

    template_fields: Sequence[str] = ("operator_kwargs", "step_uri")

    def __init__(self, *, step_uri: str, operator_kwargs: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(provider_class=POD_OPERATOR, operator_kwargs=operator_kwargs, **kwargs)
        self.step_uri = step_uri

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowException as err:
            self._explain(err)
            raise

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except AirflowException as err:
            self._explain(err)
            raise

    def _explain(self, err: AirflowException) -> None:
        """Raise the pod's cause from ``err``, or return (the caller re-raises ``err``) when the pod says nothing
        more, or cannot be read (the provider's error is then the best there is)."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from operators.pod_failures import explain, read_pod

        if isinstance(err, AirflowSkipException):
            return  # a skip (``skip_on_exit_code``) is the provider's answer, not a failure
        kwargs = self.operator_kwargs
        remote = getattr(self._built, "pod", None)
        name = remote.metadata.name if remote is not None else kwargs["name"]
        try:
            pod = read_pod(KubernetesHook(conn_id=kwargs["kubernetes_conn_id"]), kwargs["namespace"], name)
        except Exception as read_err:  # noqa: BLE001 - the API server may be what failed: keep the provider's error
            self.log.warning("could not read pod %s for its cause: %s", name, read_err)
            return
        if remote is None and pod is None:
            return  # the pod was never created under this name: nothing to read
        cause = explain(pod, name, step_uri=self.step_uri)
        if cause is not None:
            raise cause from err


class JobSetSensor(BaseSensorOperator):
    """Wait for a JobSet to finish: True on its ``Completed`` condition, fail on ``Failed`` with the causes its
    pods ended with (:func:`operators.pod_failures.jobset_failure`).

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

        from operators.pod_failures import jobset_failure

        hook = KubernetesHook(conn_id=self.kubernetes_conn_id)
        obj = hook.get_custom_object(group=JOBSET_GROUP, version=JOBSET_VERSION, plural=JOBSET_PLURAL,
                                     name=self.name, namespace=self.namespace)
        try:
            return jobset_finished(obj, AirflowFailException)
        except AirflowFailException as err:  # Failed: name what ended its pods (OOMKilled fails as PodOOMKilled)
            raise jobset_failure(hook, self.namespace, self.name, str(err)) from err


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
                            settings.s3_endpoint_url or recipe.storage.endpoint_url, recipe.storage.region,
                            settings.gcs_endpoint_url)
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
            launch = PodLaunchOperator(task_id="launch", step_uri=step_uri,
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


__all__ = ["JobSetSensor", "PodLaunchOperator", "gke_train_group", "jobset_finished", "pod_operator_kwargs"]
