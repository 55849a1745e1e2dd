"""GKE node pools as KWOK nodes: the Node objects a pool of a given machine gets on GKE.

Labels, taints and allocatable are those GKE gives a node of the pool (not read off tidal's pod
specs, so a pod lands on one only if its selectors and tolerations match what GKE would offer):

* every node: ``cloud.google.com/gke-nodepool``, ``node.kubernetes.io/instance-type`` (the machine
  type of tidal's hardware tables), ``kubernetes.io/hostname``, ``type=kwok`` (KWOK manages it);
* TPU pool: ``cloud.google.com/gke-tpu-accelerator``, ``cloud.google.com/gke-tpu-topology``, taint
  ``google.com/tpu=present:NoSchedule``, ``google.com/tpu`` = chips per host; one node per host of
  each slice (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus);
* GPU pool: ``cloud.google.com/gke-accelerator``, taint ``nvidia.com/gpu=present:NoSchedule``,
  ``nvidia.com/gpu`` = the machine's GPUs (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus);
* Spot pool: label ``cloud.google.com/gke-spot=true`` and the taint
  ``cloud.google.com/gke-spot=true:NoSchedule`` that keeps other pods off it
  (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms).

Each node also carries the addresses a kubelet registers (``InternalIP`` = KWOK's kubelet API address,
``Hostname`` = its name). KWOK's own ``node-initialize`` stage writes ``addresses:`` whenever one of
the two is missing, and it has no node name to fill ``Hostname`` with: a node whose lease lapsed on a
loaded machine (Ready went Unknown) was re-initialized with ``addresses: null``, after which the API
server could not reach its kubelet (``kubectl logs``: "no preferred addresses found").
"""

from __future__ import annotations

from tests.cluster.kube import KUBELET_IP
from tidal.launch.resources import (
    GPU_ACCELERATOR_LABEL,
    GPU_RESOURCE,
    SPOT_LABEL,
    TPU_ACCELERATOR_LABEL,
    TPU_RESOURCE,
    TPU_TOPOLOGY_LABEL,
    gpu_type,
    tpu_slice,
)
from tidal.recipe import ResourceConfig

POOL_LABEL = "cloud.google.com/gke-nodepool"
MACHINE_LABEL = "node.kubernetes.io/instance-type"
CPU_MACHINE = "n2-standard-32"


def node_pool(resources: ResourceConfig, pool: str) -> list[dict]:
    """The Nodes of the GKE node pool named ``pool`` that ``resources`` would run on, sized for it
    (hosts x slices for TPU, ``nodes`` for GPU and CPU)."""
    acc = resources.accelerator
    labels = {POOL_LABEL: pool, "type": "kwok"}
    taints: list[dict] = []
    allocatable = {"cpu": "200", "memory": "1500Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    if acc.kind == "tpu":
        tpu, topo = tpu_slice(acc.type, acc.topology)
        labels |= {TPU_ACCELERATOR_LABEL: tpu.gke_accelerator, TPU_TOPOLOGY_LABEL: topo.topology,
                   MACHINE_LABEL: topo.machine_type}
        taints.append({"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
        allocatable[TPU_RESOURCE] = str(topo.chips_per_host)
        count = topo.hosts * acc.slices
    elif acc.kind == "gpu":
        gpu = gpu_type(acc.type, acc.count)
        labels |= {GPU_ACCELERATOR_LABEL: gpu.gke_accelerator, MACHINE_LABEL: gpu.counts[acc.count]}
        taints.append({"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
        allocatable[GPU_RESOURCE] = str(acc.count)
        count = acc.nodes
    else:
        labels[MACHINE_LABEL] = CPU_MACHINE
        count = acc.nodes
    if resources.spot:
        labels[SPOT_LABEL] = "true"
        taints.append({"key": SPOT_LABEL, "value": "true", "effect": "NoSchedule"})
    nodes = []
    for i in range(count):
        name = f"gke-{pool}-{i}"
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name},
                                   "annotations": {"kwok.x-k8s.io/node": "fake"}},
                      "spec": {"taints": taints},
                      "status": {"allocatable": allocatable, "capacity": allocatable,
                                 "addresses": [{"type": "InternalIP", "address": KUBELET_IP},
                                               {"type": "Hostname", "address": name}]}})
    return nodes
