"""A training step launched through a real Kubernetes API server, preempted, resumed from the
bucket and committed (the scenario: tests/cluster/gke_scenario.py)."""

from __future__ import annotations

import pytest

from tests.cluster import train_scenario as ts
from tests.cluster.gke_scenario import POOL, preempted_and_resumed, train_through_kube
from tests.cluster.node_pools import POOL_LABEL, SPOT_LABEL

pytestmark = pytest.mark.timeout(1200)


def test_a_pod_created_on_the_api_server_is_preempted_resumes_from_the_bucket_and_commits(
        cluster, kube, installed, tmp_path):
    run = train_through_kube(cluster, kube, installed, tmp_path)
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
    assert f"fetched checkpoint {preempted_at} from {run.prepared['step_uri']}" in retry.log, logs
    assert first.ran_on != retry.ran_on  # a fresh node: nothing on a disk carried over
    assert not retry.deleted and retry.returncode == 0, logs
    assert preempted_and_resumed(run)
    status = kube.get_json("pod", retry.pod, "-n", namespace)["status"]
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert run.committed, run.commit_output[-3000:]
