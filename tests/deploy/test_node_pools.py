"""Training workloads placed by the real kube-scheduler onto simulated GKE node pools (KWOK).

Each workload of the hardware matrix that is one pod (CPU, a GPU node, a single-host TPU slice)
is created for real in the training namespace, next to one node pool per case
(tests/cluster/node_pools.py: the labels, taints and allocatable GKE gives such nodes). The
scheduler must bind each pod to a node of the right accelerator, topology and capacity class
(Spot or on-demand), KWOK then reports it Running. Multi-host slices go through the Jobs a
JobSet makes: the Job controller creates the pods, one per host of the slice.
"""

from __future__ import annotations

import json
import time

from tests.cluster.kube import KubeServer
from tests.cluster.node_pools import MACHINE_LABEL, POOL_LABEL, node_pool
from tests.deploy.kube_checks import STEP_URI, matrix_objects
from tests.launch.test_pods import MATRIX
from tidal.launch.pods import is_single_pod, workload
from tidal.launch.resources import GPU_ACCELERATOR_LABEL, SPOT_LABEL, TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL
from tidal.recipe import ResourceConfig

PLACEMENT_LABELS = (TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL, GPU_ACCELERATOR_LABEL, SPOT_LABEL, MACHINE_LABEL)


def config(resources: dict, namespace: str) -> ResourceConfig:
    return ResourceConfig.model_validate({**resources, "namespace": namespace})


def accelerators(resources: ResourceConfig) -> int:
    """Accelerators one pod of ``resources`` asks for (0 for CPU)."""
    pod = workload(resources, name="x", step_uri=STEP_URI)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return sum(int(v) for k, v in limits.items() if k in ("google.com/tpu", "nvidia.com/gpu"))


def create_pools(kube: KubeServer, cases: list[tuple[str, dict]], namespace: str, prefix: str) -> dict[str, dict]:
    """One node pool per case, named ``<prefix><i>``; returns each pool's placement labels."""
    nodes, pools = [], {}
    for i, (_, resources) in enumerate(cases):
        pool = node_pool(config(resources, namespace), f"{prefix}{i}")
        nodes += pool
        pools[f"{prefix}{i}"] = {k: v for k, v in pool[0]["metadata"]["labels"].items() if k in PLACEMENT_LABELS}
    kube.add_nodes(nodes)
    return pools


def wait_running(kube: KubeServer, namespace: str, selector: str, count: int, timeout_s: float = 120) -> list[dict]:
    """The ``count`` pods matching ``selector`` once all are Running; AssertionError naming the
    stragglers and their scheduling conditions after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = kube.get_json("pods", "-n", namespace, "-l", selector)["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        if len(running) == count == len(pods):
            return pods
        if time.monotonic() > deadline:
            waiting = {p["metadata"]["name"]: p["status"].get("conditions") for p in pods if p not in running}
            raise AssertionError(f"{len(running)}/{count} pods Running after {timeout_s:.0f} s: {waiting}")
        time.sleep(0.5)


def test_each_single_pod_workload_is_placed_on_a_node_of_its_pool_and_runs(kube, installed):
    namespace = installed["training"]["namespace"]
    # Most accelerators first: a 1-GPU pod may take a bigger machine of its type (its selector names
    # the GPU, not the machine), so the pools fill exactly only when the biggest pods come first,
    # as the scheduler's queue takes pods of one priority in the order they were created.
    cases = sorted(((case, r) for case, r in MATRIX if is_single_pod(config(r, namespace))),
                   key=lambda item: -accelerators(config(item[1], namespace)))
    assert len(cases) >= 30
    pools = create_pools(kube, cases, namespace, "p")
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.get_json("nodes")["items"]}
    pods = [workload(config(r, namespace), name=f"s{i}", step_uri=STEP_URI,
                     labels={"tidal.test/placement": "single"}) for i, (_, r) in enumerate(cases)]
    kube.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    try:
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"]
                  for p in wait_running(kube, namespace, "tidal.test/placement=single", len(cases))}
        for i, (case, _) in enumerate(cases):
            node = nodes[placed[f"s{i}"]]
            own = pools[f"p{i}"]
            # the accelerator, topology and Spot class of its own pool (a GPU pod may share a
            # bigger machine of its type, so the machine type is not compared)
            wanted = {k: v for k, v in own.items() if k != MACHINE_LABEL}
            assert {k: node.get(k) for k in wanted} == wanted, (case, node)
            assert SPOT_LABEL in node or SPOT_LABEL not in own, (case, node)
    finally:
        kube.kubectl("delete", "pods", "-n", namespace, "-l", "tidal.test/placement=single", "--wait=false")


def test_a_multi_host_slice_gets_one_pod_per_host_from_the_job_controller(kube, installed):
    namespace = installed["training"]["namespace"]
    cases = [(c, r) for c, r in MATRIX if c in ("v5e-4x4-ondemand", "v5p-2x2x2-x2-spot")]
    assert len(cases) == 2, [c for c, _ in MATRIX if "x2" in c][:5]
    create_pools(kube, cases, namespace, "m")
    objects = matrix_objects(cases, namespace)
    jobs = [obj for key, (_, obj) in objects.items() if key.startswith("job/")]
    kube.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": jobs}))
    try:
        for (case, resources), job in zip(cases, jobs, strict=True):
            slice_hosts = job["spec"]["parallelism"]
            pods = wait_running(kube, namespace, f"job-name={job['metadata']['name']}", slice_hosts)
            hosts = {p["spec"]["nodeName"] for p in pods}
            assert len(hosts) == slice_hosts, (case, hosts)  # one pod per TPU host, never two on one
            topology = resources["accelerator"]["topology"]
            for host in hosts:
                labels = kube.get_json("node", host)["metadata"]["labels"]
                assert labels[TPU_TOPOLOGY_LABEL] == topology and labels[POOL_LABEL].startswith("m"), labels
    finally:
        for job in jobs:
            kube.kubectl("delete", "job", job["metadata"]["name"], "-n", namespace, "--cascade=foreground",
                         "--wait=false")


def _taints(kube) -> dict[str, int]:
    """How many nodes carry each taint key (what an "untolerated taint" message leaves out)."""
    counts: dict[str, int] = {}
    for node in kube.get_json("nodes")["items"]:
        for taint in node["spec"].get("taints", []) or [{"key": "(none)"}]:
            counts[taint["key"]] = counts.get(taint["key"], 0) + 1
    return counts


def test_a_workload_no_pool_can_hold_stays_pending_as_unschedulable(kube, installed):
    namespace = installed["training"]["namespace"]
    pod = workload(config({"accelerator": {"kind": "cpu"}, "launcher": "gke", "memory": "4000Gi"}, namespace),
                   name="too-big", step_uri=STEP_URI)
    kube.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = kube.get_json("pod", "too-big", "-n", namespace)["status"]
            scheduled = [c for c in status.get("conditions", []) if c["type"] == "PodScheduled"]
            if scheduled and scheduled[0]["status"] == "False":
                break
            time.sleep(0.5)
        assert scheduled and scheduled[0]["reason"] == "Unschedulable", status
        assert "Insufficient memory" in scheduled[0]["message"], (scheduled[0], _taints(kube))
        assert status["phase"] == "Pending"
    finally:
        kube.kubectl("delete", "pod", "too-big", "-n", namespace, "--wait=false")


def test_a_node_whose_ready_lapses_keeps_its_addresses_and_serves_logs(kube, installed):
    """A node whose lease lapsed (Ready Unknown) is re-initialized by KWOK; it must keep the addresses
    the API server reaches its kubelet by (the full suite once lost them: ``kubectl logs`` then said
    "no preferred addresses found")."""
    resources = config({"accelerator": {"kind": "cpu"}, "launcher": "gke"}, installed["training"]["namespace"])
    [node] = node_pool(resources, "lapse")
    name = node["metadata"]["name"]
    kube.add_nodes([node])
    before = kube.get_json("node", name)["status"]
    conditions = [{**c, "status": "Unknown"} if c["type"] == "Ready" else c for c in before["conditions"]]
    kube.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": conditions}}))
    deadline = time.monotonic() + 120
    while True:  # KWOK's node-initialize stage makes it Ready again (the taint the controller put is not waited for)
        after = kube.get_json("node", name)["status"]
        if any(c["type"] == "Ready" and c["status"] == "True" for c in after["conditions"]):
            break
        assert time.monotonic() < deadline, after["conditions"]
        time.sleep(0.5)
    assert {a["type"]: a["address"] for a in after.get("addresses") or []} == {"InternalIP": "127.0.0.1",
                                                                              "Hostname": name}
