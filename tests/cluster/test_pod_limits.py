"""The test kubelet applies a pod's limits to the node it boots (tests/cluster/pod_runner.py: ``pod_limits``),
and a pod killed at its memory limit reaches the launch task as ``PodOOMKilled`` (operators/pod_failures.py):
the kernel kills it, the status says OOMKilled, the cause names the limit; a pod past its ``tmp`` emptyDir's
``sizeLimit`` is evicted as a kubelet evicts it, and reaches the task as ``PodEvicted`` (retried)."""

from __future__ import annotations

import time

from airflow.sdk.exceptions import AirflowFailException

from operators.pod_failures import PodEvicted, PodOOMKilled, explain
from tests.cluster.limits_scenario import ALLOCATE, FILL_TMP, SHOW_ENV, printed_numbers, run_pod, small_pod
from tests.cluster.pod_runner import pod_limits


def test_a_pod_past_its_memory_limit_is_oom_killed_and_fails_with_its_cause(cluster, kube, installed, tmp_path):
    namespace = installed["training"]["namespace"]
    pod, resources = small_pod(namespace, ALLOCATE)
    assert pod_limits(pod) == {"memory_mb": 256, "tmpfs_mb": 20480}
    end = run_pod(cluster, kube, namespace, tmp_path, pod, resources)
    assert end.run.returncode == 137, end.run.log[-2000:]
    blocks = printed_numbers(end.run.log)
    assert blocks and max(blocks) * 64 < 256, end.run.log[-500:]  # MiB the pod held when the kernel killed it
    assert end.pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    err = explain(end.pod, end.run.pod)
    assert isinstance(err, PodOOMKilled) and isinstance(err, AirflowFailException)
    assert (f"pod {end.run.pod} on node {end.run.bound_to} was OOMKilled (exit 137) at its memory limit 256Mi"
            in str(err))


def test_a_pod_writing_past_its_tmp_size_limit_is_evicted_and_retried(cluster, kube, installed, tmp_path):
    namespace = installed["training"]["namespace"]
    pod, resources = small_pod(namespace, FILL_TMP, memory="1Gi", tmp_size="64Mi")
    assert pod_limits(pod)["tmpfs_mb"] == 128  # room past the limit: the kubelet's check ends it
    end = run_pod(cluster, kube, namespace, tmp_path, pod, resources)
    written = printed_numbers(end.run.log)
    assert end.run.returncode != 0 and written and 64 <= max(written) < 128, end.run.log[-2000:]
    assert "No space left on device" not in end.run.log
    assert (end.pod["status"]["phase"], end.pod["status"]["reason"]) == ("Failed", "Evicted")
    err = explain(end.pod, end.run.pod)
    assert isinstance(err, PodEvicted) and not isinstance(err, AirflowFailException)
    assert 'Usage of EmptyDir volume "tmp" exceeds the limit "64Mi". Retried' in str(err)


def test_a_pods_container_gets_its_specs_env_only_and_its_log_is_served(cluster, kube, installed, tmp_path):
    """As from a kubelet: the image's env and the spec's, nothing of the harness; ``kubectl logs`` (what the
    KubernetesPodOperator reads) returns the container's output through the API server."""
    namespace = installed["training"]["namespace"]
    pod, resources = small_pod(namespace, SHOW_ENV + "\nimport time; time.sleep(3)", memory="512Mi")
    declared = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    seen_live: list[str] = []

    def read_live(log: str) -> None:  # while the pod runs (the runner waits for this call)
        if "training output" not in log or seen_live:
            return
        # the line is in the container log file; KWOK serves it once it has seen the pod's Logs object,
        # which on a loaded machine can take a few seconds after the pod starts: ask until it does
        deadline = time.monotonic() + 30
        while True:
            served = kube.kubectl("logs", pod["metadata"]["name"], "-n", namespace, check=False)
            if "training output" in served.stdout or time.monotonic() > deadline:
                seen_live.append(served.stdout + served.stderr)  # stderr: why the API server could not serve it
                return
            time.sleep(0.5)

    run = run_pod(cluster, kube, namespace, tmp_path, pod, resources, on_output=read_live).run
    env = {line.split()[1] for line in run.log.splitlines() if line.startswith("ENV ")}
    image = set(cluster.image_env())
    assert env - {"PWD", "SHLVL", "_", "HOSTNAME", "OLDPWD"} <= declared | image, sorted(env - declared - image)
    assert not env & {"AWS_SECRET_ACCESS_KEY", "TIDAL_S3_ENDPOINT_URL", "TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI"}
    assert seen_live and "training output: step 1 loss 9.9" in seen_live[0], seen_live
    after = kube.kubectl("logs", run.pod, "-n", namespace)
    assert after.stdout.splitlines()[-1] == "training output: step 1 loss 9.9"
    assert sum(line.startswith("ENV ") for line in after.stdout.splitlines()) == len(env)
