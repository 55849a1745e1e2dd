"""A failed training pod's cause, read back from a real kube-apiserver by the launch task's own code
(operators/pod_failures.py, through the cncf-kubernetes provider's KubernetesHook with the chart's worker
credentials): the status below is what the kubelet writes for an OOM kill and for an eviction."""

from __future__ import annotations

import json
import os
import uuid
from unittest.mock import patch

import pytest
from airflow.sdk.exceptions import AirflowFailException

from operators.pod_failures import PodEvicted, PodNodeLost, PodOOMKilled, explain, read_pod
from tests.deploy.kube_checks import STEP_URI, worker_connection
from tidal.launch.pods import workload
from tidal.recipe import ResourceConfig


@pytest.fixture
def hook(kube, installed):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    with patch.dict(os.environ, {"AIRFLOW_CONN_KUBERNETES_DEFAULT": worker_connection(kube, installed)}):
        yield KubernetesHook(conn_id="kubernetes_default")


def ended_pod(kube, namespace: str, status: dict, labels: dict[str, str] | None = None) -> str:
    """Create a training pod on a node no kubelet serves (nothing else writes its status), then write
    ``status`` through the status subresource, as the kubelet does when the pod ends."""
    name = f"tidal-fail-{uuid.uuid4().hex[:6]}"
    pod = workload(ResourceConfig.model_validate({"namespace": namespace, "memory": "512Mi"}), name=name,
                   step_uri=STEP_URI, labels=labels)
    pod["spec"]["nodeName"] = "gke-node-gone"
    kube.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))
    return name


def terminated(code: int, reason: str) -> dict:
    """A pod status as the kubelet writes it when the container ended with ``code`` for ``reason``."""
    return {"phase": "Failed", "containerStatuses": [{
        "name": "train", "ready": False, "restartCount": 0, "image": "tidal", "imageID": "",
        "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": "2026-12-06T00:00:00Z",
                                 "finishedAt": "2026-12-06T00:10:00Z"}}}]}


def test_an_oom_killed_pod_fails_once_with_its_limit_and_peak(kube, installed, hook, tmp_path):
    namespace = installed["training"]["namespace"]
    name = ended_pod(kube, namespace, terminated(137, "OOMKilled"))
    step = tmp_path / "step"
    step.mkdir()
    (step / "metrics.jsonl").write_text('{"step": 10, "peak_memory_bytes": 400000000}\n'
                                        '{"step": 20, "peak_memory_bytes": 500000000}\nnot json\n')
    pod = read_pod(hook, namespace, name)
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    err = explain(pod, name, step_uri=str(step))
    assert isinstance(err, PodOOMKilled) and isinstance(err, AirflowFailException)  # Airflow does not retry it
    text = str(err)
    assert f"pod {name} on node gke-node-gone was OOMKilled (exit 137) at its memory limit 512Mi" in text
    assert "0.47 GiB" in text and "raise train.resources.memory" in text


def test_an_evicted_pod_is_retried_with_the_kubelets_reason(kube, installed, hook):
    namespace = installed["training"]["namespace"]
    words = 'Usage of EmptyDir volume "tmp" exceeds the limit "10Gi". '
    name = ended_pod(kube, namespace, {"phase": "Failed", "reason": "Evicted", "message": words})
    err = explain(read_pod(hook, namespace, name), name)
    assert isinstance(err, PodEvicted) and not isinstance(err, AirflowFailException)
    assert 'Evicted by the kubelet: Usage of EmptyDir volume "tmp" exceeds the limit "10Gi". Retried' in str(err)


def test_a_pod_gone_with_its_node_is_a_lost_node(kube, installed, hook):
    namespace = installed["training"]["namespace"]
    name = ended_pod(kube, namespace, {"phase": "Running"})
    kube.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--wait=true")
    assert read_pod(hook, namespace, name) is None
    err = explain(None, name)
    assert isinstance(err, PodNodeLost) and "the pod no longer exists" in str(err)


def test_the_launch_task_re_raises_the_providers_failure_as_the_pods_cause(kube, installed, hook, tmp_path):
    from airflow.sdk.exceptions import AirflowException, AirflowSkipException

    from operators.gke import PodLaunchOperator, pod_operator_kwargs

    namespace = installed["training"]["namespace"]
    name = ended_pod(kube, namespace, terminated(137, "OOMKilled"))
    manifest = workload(ResourceConfig.model_validate({"namespace": namespace}), name=name, step_uri=STEP_URI)
    launch = PodLaunchOperator(task_id="launch", step_uri=str(tmp_path),  # no metrics.jsonl: no peak logged
                               operator_kwargs=pod_operator_kwargs(manifest))
    provider_error = AirflowException(f"Pod {name} returned a failure.")
    with pytest.raises(PodOOMKilled) as raised:
        launch._explain(provider_error)
    assert raised.value.__cause__ is provider_error and "OOMKilled (exit 137)" in str(raised.value)
    assert "the trainer logged no memory before it was killed" in str(raised.value)
    assert launch._explain(AirflowSkipException("exit code 99")) is None  # a skip stays a skip
    running = ended_pod(kube, namespace, {"phase": "Running"})  # never terminated: the provider's error stands
    launch.operator_kwargs = {**launch.operator_kwargs, "name": running}
    assert launch._explain(AirflowException("Pod took too long to start")) is None


def test_a_failed_jobset_names_its_pods_causes_the_oom_kill_first(kube, installed, hook):
    from operators.pod_failures import JOBSET_LABEL, JobSetFailed, jobset_failure

    namespace = installed["training"]["namespace"]
    jobset = f"tidal-js-{uuid.uuid4().hex[:6]}"
    crashed = ended_pod(kube, namespace, terminated(1, "Error"), {JOBSET_LABEL: jobset})
    assert isinstance(jobset_failure(hook, namespace, jobset, "JobSet failed"), JobSetFailed)
    oom = ended_pod(kube, namespace, terminated(137, "OOMKilled"), {JOBSET_LABEL: jobset})
    err = jobset_failure(hook, namespace, jobset, f"JobSet {jobset} failed after 2 restarts: reached max restarts")
    assert isinstance(err, PodOOMKilled) and isinstance(err, AirflowFailException)
    first, *rest = str(err).splitlines()
    assert first == f"JobSet {jobset} failed after 2 restarts: reached max restarts"
    assert f"pod {oom} on node gke-node-gone was OOMKilled" in rest[0] and f"pod {crashed}" in rest[1]
