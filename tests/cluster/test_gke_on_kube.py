"""The GKE task group's launches on a real Kubernetes API server without Airflow around them: a
single-host training pod preempted, resumed from the bucket and committed
(tests/cluster/gke_scenario.py), and a two-host JobSet created, watched and deleted by the task
group's operators (tests/cluster/jobset_scenario.py); both share one storage root, so the second
reuses the first's committed upstream steps.

Marked ``slow`` (``pytest -m slow``; bench/k8s_box.py runs the same scenarios): CI runs both paths in
production shape instead, through the scheduler, triggerer and Celery workers
(tests/cluster/test_airflow_celery.py), which covers what these assert and more."""

from __future__ import annotations

import uuid

import pytest

from tests.cluster import train_scenario as ts
from tests.cluster.gke_scenario import POOL, preempted_and_resumed, train_through_kube
from tests.cluster.jobset_scenario import HOSTS, JOBSET_LABEL, ran_as_two_hosts, train_jobset_through_kube
from tests.cluster.node_pools import CPU_MACHINE, MACHINE_LABEL, POOL_LABEL, SPOT_LABEL

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


@pytest.fixture(scope="module")
def root() -> str:
    return f"s3://tidal/k8s-{uuid.uuid4().hex[:8]}"


def test_a_pod_created_on_the_api_server_is_preempted_resumes_from_the_bucket_and_commits(
        cluster, kube, installed, tmp_path, root):
    run = train_through_kube(cluster, kube, installed, tmp_path, root=root)
    namespace = installed["training"]["namespace"]
    first, retry = run.runs
    logs = "\n".join(f"--- {r.pod} on {r.bound_to} rc={r.returncode}\n{r.log[-2500:]}" for r in run.runs)

    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.get_json("nodes")["items"]}
    for pod_run in run.runs:  # the scheduler put both on the Spot pool, never elsewhere
        labels = nodes[pod_run.bound_to]
        assert labels[POOL_LABEL] == POOL and labels[SPOT_LABEL] == "true", pod_run
    assert first.deleted and first.returncode == 75, logs  # SIGTERM: saved the step it stopped at, exit 75
    preempted_at = int(ts.PREEMPTED.search(first.log).group(1))
    assert int(ts.RESUMED.search(retry.log).group(1)) == preempted_at, logs
    assert f"read checkpoint {preempted_at} from {run.prepared['step_uri']}" in retry.log, logs
    assert first.ran_on != retry.ran_on  # a fresh node: nothing on a disk carried over
    assert not retry.deleted and retry.returncode == 0, logs
    assert preempted_and_resumed(run)
    status = kube.get_json("pod", retry.pod, "-n", namespace)["status"]
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert run.committed, run.commit_output[-3000:]


def test_a_two_host_jobset_from_the_task_groups_operators_runs_completes_is_deleted_and_commits(
        cluster, kube, installed, tmp_path, root):
    run = train_jobset_through_kube(cluster, kube, installed, tmp_path, root=root)
    logs = "\n".join(f"--- {r.pod} on {r.bound_to} rc={r.returncode}\n{r.log[-2500:]}" for r in run.runs)

    # JobSet's defaulting webhook saw the create (fields tidal leaves to it), its controller made one
    # Indexed Job of two pods with the JobSet's DNS names
    assert "startupPolicy" not in run.manifest["spec"]
    assert "publishNotReadyAddresses" not in run.manifest["spec"]["network"]
    assert run.created["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert run.created["spec"]["network"]["publishNotReadyAddresses"] is True
    (job,) = run.jobs
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == HOSTS, job["spec"]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    assert [p["spec"]["hostname"] for p in run.pods] == [f"{run.name}-workers-0-{i}" for i in range(HOSTS)]
    assert {p["spec"]["subdomain"] for p in run.pods} == {run.name}
    assert all(p["metadata"]["labels"][JOBSET_LABEL] == run.name for p in run.pods)
    # kube-scheduler spread them over two CPU nodes (no selector: any untainted pool, e.g. the one
    # made for this run); the test kubelet ran each on a fresh node of the test cluster
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.get_json("nodes")["items"]}
    assert len({r.bound_to for r in run.runs}) == HOSTS, [r.bound_to for r in run.runs]
    assert all(nodes[r.bound_to][MACHINE_LABEL] == CPU_MACHINE for r in run.runs), [r.bound_to for r in run.runs]
    assert ran_as_two_hosts(run), logs
    # the sensor saw Completed only after both exited; delete took the JobSet and what it owned
    assert run.sensor_pokes >= 1 and run.completed_after_s < 60
    assert run.deleted
    assert run.committed, run.commit_output[-3000:]
