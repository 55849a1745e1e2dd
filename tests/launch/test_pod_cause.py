"""A pod's end, read as one cause: the shapes below are the API server's pod objects as the kubelet and
the control plane write them (Kubernetes "Pod Lifecycle", "Disruptions"; GKE graceful node shutdown)."""

from __future__ import annotations

import pytest

from tidal.launch.pod_cause import EXIT_PREEMPTED, pod_cause
from tidal.train.preemption import EXIT_PREEMPTED as TRAINER_EXIT_PREEMPTED


def pod(*, phase="Failed", reason=None, message=None, terminated=None, conditions=(), memory="8Gi"):
    status = {"phase": phase, "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if terminated is not None:
        status["containerStatuses"] = [{"name": "train", "state": {"terminated": terminated}}]
    return {"metadata": {"name": "tidal-abc"}, "spec": {"nodeName": "gke-spot-1",
            "containers": [{"name": "train", "resources": {"limits": {"memory": memory}}}]}, "status": status}


def disruption(reason: str, message: str = "") -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}


def test_the_launch_code_and_the_trainer_agree_on_the_preempted_exit_code():
    assert EXIT_PREEMPTED == TRAINER_EXIT_PREEMPTED


@pytest.mark.parametrize(("obj", "cause", "retried"), [
    (pod(terminated={"exitCode": 137, "reason": "OOMKilled"}), "oom_killed", False),
    (pod(reason="Evicted", message='Usage of EmptyDir volume "tmp" exceeds the limit "10Gi". ',
         terminated={"exitCode": 137, "reason": "Error"}), "evicted", True),
    (pod(reason="Terminated", message="Pod was terminated in response to imminent node shutdown.",
         terminated={"exitCode": 143, "reason": "Error"},
         conditions=[disruption("TerminationByKubelet")]), "preempted", True),
    (pod(terminated={"exitCode": 75, "reason": "Error"}), "preempted", True),
    (pod(conditions=[disruption("PreemptionByScheduler", "preempted by a higher-priority pod")]), "preempted", True),
    (pod(conditions=[disruption("DeletionByPodGC", "PodGC: node no longer exists")]), "node_lost", True),
    (pod(reason="NodeLost", message="Node gke-spot-1 which was running pod tidal-abc is unresponsive"),
     "node_lost", True),
    (None, "node_lost", True),
    (pod(terminated={"exitCode": 2, "reason": "Error", "message": "tidal.train: error: bad spec"}), "failed", False),
    (pod(phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"}), "succeeded", False),
])
def test_each_end_is_one_cause(obj, cause, retried):
    got = pod_cause(obj, "tidal-abc")
    assert (got.cause, got.retried) == (cause, retried)
    assert got.pod == "tidal-abc"


def test_an_oom_kill_names_the_limit_the_peak_and_the_field_to_raise():
    got = pod_cause(pod(terminated={"exitCode": 137, "reason": "OOMKilled"}, memory="512Mi"))
    text = got.describe(peak_memory_bytes=480 * 2**20)
    assert "OOMKilled (exit 137) at its memory limit 512Mi" in text
    assert "0.47 GiB" in text and "Not retried" in text and "train.resources.memory" in text
    assert "logged no memory" in got.describe()


def test_an_eviction_keeps_the_kubelets_words():
    got = pod_cause(pod(reason="Evicted", message='Usage of EmptyDir volume "tmp" exceeds the limit "10Gi". '))
    assert got.node == "gke-spot-1"
    assert got.describe() == ('pod tidal-abc on node gke-spot-1 was Evicted by the kubelet: Usage of EmptyDir '
                              'volume "tmp" exceeds the limit "10Gi". Retried on a fresh node.')
