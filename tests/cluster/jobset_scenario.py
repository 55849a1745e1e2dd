"""A two-host training step launched as a JobSet through a real API server and the GKE task group's
operators, then committed; for tests/cluster/test_gke_on_kube.py and bench/k8s_box.py.

What the ``{step}.create`` / ``{step}.wait`` / ``{step}.delete`` tasks of
:func:`operators.gke.gke_train_group` run, with the provider's own operators built by
:class:`operators.remote.ProviderOperator` from the same arguments, on a ``kubernetes_default``
connection that holds a token the API server signed for the Airflow worker's service account (so
the chart's RBAC is what lets them act): ``KubernetesCreateResourceOperator`` creates the JobSet of
:func:`tidal.launch.pods.workload` (CPU, two hosts); the real JobSet controller (its webhooks
default and validate it) makes the Indexed Job and its headless Service, the Job controller the two
pods, kube-scheduler binds them to the node pool (KWOK nodes), and the test kubelet
(tests/cluster/pod_runner.py) runs both commands side by side on fresh nodes, the completion index
from the downward API and the coordinator found by the pod's JobSet DNS name. When both exit 0 the
Job completes, the JobSet controller sets ``Completed``, :class:`operators.gke.JobSetSensor`'s poke
returns True, ``KubernetesDeleteResourceOperator`` removes the JobSet and the commit runs on a
last node.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import yaml

from tests.cluster import scenario as sc
from tests.cluster import train_scenario as ts
from tests.cluster.harness import Cluster
from tests.cluster.kube import KubeServer
from tests.cluster.node_pools import node_pool
from tests.cluster.pod_runner import PodRun, PodRunner, storage_secret
from tests.deploy.kube_checks import worker_connection
from tidal.launch.pods import storage_env, workload
from tidal.recipe import ResourceConfig

POOL = "cpu-hosts"
HOSTS = 2
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class JobSetRun:
    step_id: str
    name: str
    prepared: dict
    manifest: dict  # what the create task sent
    created: dict  # the JobSet as the server stored it (after JobSet's defaulting webhook)
    jobs: list[dict]  # the Jobs the JobSet controller made (as they were when both pods had exited)
    pods: list[dict]  # the pods the Job controller made, as bound by the scheduler
    runs: list[PodRun]
    sensor_pokes: int  # pokes until Completed (the first comes before the pods run: False)
    completed_after_s: float  # seconds from the pods' exit to the sensor's True
    deleted: bool  # the JobSet, its Jobs and pods are gone after the delete task
    commit_output: str
    committed: bool


def wait_pods(kube: KubeServer, namespace: str, jobset_name: str, count: int, timeout_s: float = 120) -> list[dict]:
    """The ``count`` pods of JobSet ``jobset_name`` once each is bound and Running, sorted by completion
    index; RuntimeError (with the JobSet's status and the controllers' logs) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pods: list[dict] = []
    while time.monotonic() < deadline:
        pods = kube.get_json("pods", "-n", namespace, "-l", f"{JOBSET_LABEL}={jobset_name}")["items"]
        if len(pods) == count and all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
                                      for p in pods):
            return sorted(pods, key=lambda p: int(p["metadata"]["annotations"][COMPLETION_INDEX]))
        time.sleep(0.3)
    status = kube.kubectl("get", "jobset,job,pod", "-n", namespace, "-o", "wide", check=False).stdout
    raise RuntimeError(f"JobSet {jobset_name}: {count} running pods not there after {timeout_s:.0f} s "
                       f"({len(pods)} pods)\n{status}\n{kube.logs()}")


def train_jobset_through_kube(cluster: Cluster, kube: KubeServer, values: dict, tmp: Path, *, root: str,
                              steps: int = 12, checkpoint_every: int = 6,
                              sources: tuple[str, ...] | None = sc.CLUSTER_SOURCES) -> JobSetRun:
    """Run the scenario of the module doc under ``root`` (upstream steps already committed there are reused);
    ``sources``: the slice's (None: all)."""
    from operators.gke import CONN_ID, CREATE_OPERATOR, DELETE_OPERATOR, JobSetSensor
    from operators.remote import ProviderOperator

    namespace = values["training"]["namespace"]
    resources = ResourceConfig.model_validate({"launcher": "gke", "accelerator": {"kind": "cpu", "nodes": HOSTS},
                                               "namespace": namespace})
    pool = node_pool(resources, POOL)
    kube.add_nodes(pool)

    text = ts.train_recipe(tmp, steps=steps, checkpoint_every=checkpoint_every, name="tiny_k8s", sources=sources,
                           **{"train.optimizer.warmup_steps": 2})
    plan = sc.step_names(text, tmp)
    step_name, step_id, _ = next(s for s in plan if s[2] == "train")
    ts.upstream(cluster, text, plan, root=root, run_key="k8s-jobset")
    prep = sc.on_node_argv(cluster, "jobset-prep", text, ["python", "-c", sc.PREPARE, step_name], root=root)
    prepared = json.loads(next(x for x in prep.stdout.splitlines() if x.startswith("XCOM")).removeprefix("XCOM"))

    name = f"tidal-{step_id}"
    manifest = workload(resources, name=name, step_uri=prepared["step_uri"],
                        env=storage_env(root, cluster.s3_endpoint, "us-east-1"), labels={"tidal.dev/step-id": step_id},
                        secret_env=storage_secret(kube, cluster, namespace))
    assert manifest["kind"] == "JobSet", manifest["kind"]
    common = {"yaml_conf": yaml.safe_dump(manifest, sort_keys=False), "namespace": namespace,
              "custom_resource_definition": True, "kubernetes_conn_id": CONN_ID}
    runner = PodRunner(kube, cluster, namespace, tmp)
    # the kubernetes_default connection of the Airflow worker (its service account's token)
    with patch.dict(os.environ, {"AIRFLOW_CONN_KUBERNETES_DEFAULT": worker_connection(kube, values)}):
        ProviderOperator(task_id="create", provider_class=CREATE_OPERATOR, operator_kwargs=common).execute({})
        created = kube.get_json("jobset", name, "-n", namespace)
        sensor = JobSetSensor(task_id="wait", name=name, namespace=namespace)
        pokes = 1
        assert not sensor.poke({}), "a JobSet whose pods have not run is not Completed"
        pods = wait_pods(kube, namespace, name, HOSTS)
        runs = runner.run_all([p["metadata"]["name"] for p in pods])
        exited = time.monotonic()
        jobs = kube.get_json("jobs", "-n", namespace, "-l", f"{JOBSET_LABEL}={name}")["items"]
        while not sensor.poke({}):
            pokes += 1
            if time.monotonic() - exited > 60:
                raise RuntimeError(f"JobSet {name} not Completed 60 s after its pods exited: "
                                   f"{kube.get_json('jobset', name, '-n', namespace).get('status')}\n{kube.logs()}")
            time.sleep(0.5)
        completed_after_s = time.monotonic() - exited
        ProviderOperator(task_id="delete", provider_class=DELETE_OPERATOR, operator_kwargs=common).execute({})
    deleted = _gone(kube, namespace, name)
    commit = sc.on_node_argv(cluster, "jobset-commit", text,
                             ["python", "-c", sc.COMMIT, step_name, json.dumps(prepared), "k8s-jobset"],
                             root=root, check=False)
    output = commit.stdout + commit.stderr
    return JobSetRun(step_id, name, prepared, manifest, created, jobs, pods, runs, pokes, completed_after_s, deleted,
                     output, "COMMITTED" in output and step_id in sc.bucket_markers(cluster, root))


def _gone(kube: KubeServer, namespace: str, name: str, timeout_s: float = 60) -> bool:
    """True once the JobSet and everything it owned (Jobs, pods: garbage-collected) are gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = kube.kubectl("get", "jobset,job,pod", "-n", namespace, "-l", f"{JOBSET_LABEL}={name}",
                            "-o", "name", check=False)
        jobset = kube.kubectl("get", "jobset", name, "-n", namespace, check=False)
        if not left.stdout.strip() and "NotFound" in jobset.stderr:
            return True
        time.sleep(0.5)
    return False


def ran_as_two_hosts(run: JobSetRun) -> bool:
    """Both pods exited 0 on nodes of their own, as processes 0 and 1 of one ``jax.distributed`` run."""
    return (len(run.runs) == HOSTS and all(r.returncode == 0 and not r.deleted for r in run.runs)
            and len({r.ran_on for r in run.runs}) == HOSTS
            and all(f"process {i} of {HOSTS}" in r.log for i, r in enumerate(run.runs)))
