"""A training step launched through a real Kubernetes API server, preempted once, then committed;
shared by tests/cluster/test_gke_on_kube.py and bench/k8s_box.py.

The slice of the tiny recipe runs with an ``s3://`` root on the share-nothing test cluster; its
upstream steps and its prepare each on a node. Then, as the GKE task group's launch would, the
training Pod of :func:`tidal.launch.pods.workload` (``launcher: gke``, Spot, CPU) is created on
the API server (tests/cluster/kube.py) in the training namespace of the installed chart; the real
kube-scheduler binds it to a node of the Spot node pool (KWOK), and the test's kubelet stand-in
(tests/cluster/pod_runner.py) runs its container command on a fresh node. Once a checkpoint is in
the bucket the pod is deleted, as GKE deletes the pods of a reclaimed Spot VM: the trainer gets
SIGTERM, saves the step and exits 75. The launch's retry creates the pod again; it lands on the
pool, runs on another fresh node, resumes from the checkpoint in the bucket, and its exit is
written into the pod's status. The commit runs on a last node.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import scenario as sc
from tests.cluster import train_scenario as ts
from tests.cluster.harness import Cluster
from tests.cluster.kube import KubeServer
from tests.cluster.node_pools import node_pool
from tests.cluster.pod_runner import PodRun, PodRunner, storage_secret
from tidal.launch.pods import storage_env, workload
from tidal.recipe import ResourceConfig

POOL = "spot-cpu"
REGION = "us-east-1"  # the bucket server's (tests/cluster/harness.py CREDENTIALS)


@dataclass
class KubeTrainRun:
    step_id: str
    prepared: dict
    runs: list[PodRun]
    commit_output: str
    committed: bool


def train_through_kube(cluster: Cluster, kube: KubeServer, values: dict, tmp: Path, *, root: str | None = None,
                       steps: int = 200, checkpoint_every: int = 10,
                       sources: tuple[str, ...] | None = sc.CLUSTER_SOURCES) -> KubeTrainRun:
    """Run the scenario of the module doc; ``values``: the installed chart's values; ``root``: the
    storage root in the bucket (default: a new one); ``sources``: the slice's (None: all)."""
    namespace = values["training"]["namespace"]
    resources = ResourceConfig.model_validate({"launcher": "gke", "spot": True, "accelerator": {"kind": "cpu"},
                                               "namespace": namespace, "priority_class": "tidal-train-spot"})
    pool = node_pool(resources, POOL)
    kube.add_nodes(pool)

    text = ts.train_recipe(tmp, steps=steps, checkpoint_every=checkpoint_every, name="tiny_k8s", sources=sources)
    plan = sc.step_names(text, tmp)
    name, step_id, _ = next(s for s in plan if s[2] == "train")
    root = root or f"s3://tidal/k8s-{uuid.uuid4().hex[:8]}"
    ts.upstream(cluster, text, plan, root=root, run_key="k8s")
    prep = sc.on_node_argv(cluster, "train-prep", text, ["python", "-c", sc.PREPARE, name], root=root)
    prepared = json.loads(next(x for x in prep.stdout.splitlines() if x.startswith("XCOM")).removeprefix("XCOM"))

    runner = PodRunner(kube, cluster, namespace, tmp)
    runs = []
    for attempt in range(2):
        pod = workload(resources, name=f"tidal-{step_id}-{attempt}", step_uri=prepared["step_uri"],
                       env=storage_env(root, cluster.s3_endpoint, REGION), labels={"tidal.dev/step-id": step_id},
                       secret_env=storage_secret(kube, cluster, namespace))
        kube.kubectl("create", "-f", "-", stdin=json.dumps(pod))

        def preempt(log: str, pod_name: str = pod["metadata"]["name"], first: bool = attempt == 0) -> None:
            if first and ts.COUNTED.search(log):  # a checkpoint is in the bucket: reclaim the Spot VM
                kube.kubectl("delete", "pod", pod_name, "-n", namespace, "--wait=false")

        runs.append(runner.run(pod["metadata"]["name"], on_output=preempt))
    commit = sc.on_node_argv(cluster, "train-commit", text,
                             ["python", "-c", sc.COMMIT, name, json.dumps(prepared), "k8s"], root=root, check=False)
    output = commit.stdout + commit.stderr
    return KubeTrainRun(step_id, prepared, runs, output,
                        "COMMITTED" in output and step_id in sc.bucket_markers(cluster, root))


def preempted_and_resumed(run: KubeTrainRun) -> bool:
    """The first pod was deleted mid-run and exited 75 after saving its step; the retry, on another
    fresh node, resumed from that checkpoint fetched from the bucket and exited 0."""
    first, retry = run.runs
    stopped = ts.PREEMPTED.search(first.log)
    resumed = ts.RESUMED.search(retry.log)
    return bool(first.deleted and first.returncode == 75 and stopped and resumed
                and resumed.group(1) == stopped.group(1) and first.ran_on != retry.ran_on
                and f"read checkpoint {stopped.group(1)} from {run.prepared['step_uri']}" in retry.log
                and not retry.deleted and retry.returncode == 0)
