"""Hardware facts as data: GKE accelerator types, TPU topologies and GPU node shapes.

Invariant: builders (:mod:`tidal.launch.pods`) never branch on an accelerator's name; they read
a row of these tables. Adding a TPU generation or a GPU type is one row here, with the GKE page
that states its numbers next to it. Anything not in a table is refused with the valid values,
so a typo in a recipe fails at load time instead of leaving a pod Pending on a node pool that
can never exist.

Sources (read 2026; the numbers below are copied from these pages' tables):

* ``PLAN_TPUS``: GKE "Plan TPUs in GKE", topology tables per TPU version (machine type,
  topology, chips, VMs). Multi-host slices in GKE use the 4-chip machine types, so a v5e/v6e
  ``4x4`` slice is 4 hosts of 4 chips (the Cloud TPU pages count 8-chip hosts instead).
* ``TPU_V6E``: Cloud TPU "TPU v6e" supported configurations table (same numbers for GKE).
* ``GKE_GPUS``: GKE "Run GPUs in GKE Standard node pools" (``cloud.google.com/gke-accelerator``
  values) and Compute Engine "GPU machine types" (GPUs per machine type).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

PLAN_TPUS = "https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus"
TPU_V5E = "https://cloud.google.com/tpu/docs/v5e"
TPU_V5P = "https://cloud.google.com/tpu/docs/v5p"
TPU_V6E = "https://cloud.google.com/tpu/docs/v6e"
GKE_GPUS = "https://cloud.google.com/kubernetes-engine/docs/how-to/gpus"
GPU_MACHINES = "https://cloud.google.com/compute/docs/gpus"
GKE_SPOT = "https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"

# Node labels, taints and extended resources GKE uses (PLAN_TPUS, GKE_GPUS, GKE_SPOT).
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
SPOT_LABEL = "cloud.google.com/gke-spot"


class UnknownAccelerator(ValueError):
    """An accelerator type, topology or count that no table row describes; lists the valid ones."""


@dataclass(frozen=True)
class TpuTopology:
    """One TPU slice shape as GKE schedules it.

    Attributes:
        topology: GKE's ``cloud.google.com/gke-tpu-topology`` value, e.g. ``"2x4"``.
        chips: TPU chips in the slice (product of the topology's dimensions).
        hosts: VMs (Kubernetes nodes, hence pods) in the slice.
        machine_type: the GKE node pool machine type that gives this slice.
        source: the page whose table states these numbers.
    """

    topology: str
    chips: int
    hosts: int
    machine_type: str
    source: str

    @property
    def chips_per_host(self) -> int:
        """``google.com/tpu`` request (= limit) of each pod: chips / hosts."""
        return self.chips // self.hosts

    @property
    def multi_host(self) -> bool:
        """True when the slice spans more than one VM (an Indexed Job / JobSet, not one pod)."""
        return self.hosts > 1


@dataclass(frozen=True)
class TpuType:
    """A TPU generation: its GKE accelerator label value and the slice shapes GKE offers."""

    name: str
    gke_accelerator: str
    hbm_gib_per_chip: int
    topologies: dict[str, TpuTopology]
    source: str


@dataclass(frozen=True)
class GpuType:
    """An NVIDIA GPU as GKE labels it, with the GPU counts one node (machine type) can give.

    Attributes:
        gke_accelerator: the ``cloud.google.com/gke-accelerator`` node label value.
        counts: GPUs per node -> machine type that has that many (``nvidia.com/gpu`` limit).
        memory_gb: GPU memory per GPU, GB.
    """

    gke_accelerator: str
    counts: dict[int, str]
    memory_gb: int
    source: str


def _topology(topology: str, hosts: int, machine_type: str, source: str = PLAN_TPUS) -> TpuTopology:
    chips = prod(int(d) for d in topology.split("x"))
    return TpuTopology(topology, chips, hosts, machine_type, source)


def _v5e_like(prefix: str, source: str) -> dict[str, TpuTopology]:
    """v5e and v6e share shapes: 1/4/8-chip single hosts, then 4-chip hosts (``-4t``)."""
    one, four, eight = (f"{prefix}-1t", f"{prefix}-4t", f"{prefix}-8t")
    rows = [("1x1", 1, one), ("2x2", 1, four), ("2x4", 1, eight), ("4x4", 4, four), ("4x8", 8, four),
            ("8x8", 16, four), ("8x16", 32, four), ("16x16", 64, four)]
    return {t: _topology(t, hosts, machine, source) for t, hosts, machine in rows}


def _v5p() -> dict[str, TpuTopology]:
    """v5p: 4 chips per VM (``ct5p-hightpu-4t``); 3D topologies; hosts = chips / 4 (PLAN_TPUS)."""
    shapes = ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"]
    return {t: _topology(t, max(1, prod(int(d) for d in t.split("x")) // 4), "ct5p-hightpu-4t") for t in shapes}


TPU_TYPES: dict[str, TpuType] = {
    "tpu-v5-lite-podslice": TpuType("v5e", "tpu-v5-lite-podslice", 16, _v5e_like("ct5lp-hightpu", PLAN_TPUS), TPU_V5E),
    "tpu-v5p-slice": TpuType("v5p", "tpu-v5p-slice", 95, _v5p(), TPU_V5P),
    "tpu-v6e-slice": TpuType("v6e", "tpu-v6e-slice", 32, _v5e_like("ct6e-standard", TPU_V6E), TPU_V6E),
}
TPU_ALIASES = {t.name: key for key, t in TPU_TYPES.items()}

GPU_TYPES: dict[str, GpuType] = {
    "nvidia-l4": GpuType("nvidia-l4", {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48",
                                       8: "g2-standard-96"}, 24, GPU_MACHINES),
    "nvidia-tesla-a100": GpuType("nvidia-tesla-a100", {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g",
                                                       8: "a2-highgpu-8g", 16: "a2-megagpu-16g"}, 40, GPU_MACHINES),
    "nvidia-a100-80gb": GpuType("nvidia-a100-80gb", {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g",
                                                     8: "a2-ultragpu-8g"}, 80, GPU_MACHINES),
    "nvidia-h100-80gb": GpuType("nvidia-h100-80gb", {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g",
                                                     8: "a3-highgpu-8g"}, 80, GPU_MACHINES),
    "nvidia-h100-mega-80gb": GpuType("nvidia-h100-mega-80gb", {8: "a3-megagpu-8g"}, 80, GPU_MACHINES),
    "nvidia-h200-141gb": GpuType("nvidia-h200-141gb", {8: "a3-ultragpu-8g"}, 141, GPU_MACHINES),
}


def tpu_type(name: str) -> TpuType:
    """The TPU type for a GKE accelerator name (``tpu-v5p-slice``) or its short name (``v5p``).

    Raises:
        UnknownAccelerator: naming the valid GKE names and short names.
    """
    key = TPU_ALIASES.get(name, name)
    if key not in TPU_TYPES:
        raise UnknownAccelerator(
            f"unknown TPU type {name!r}; valid: {sorted(TPU_TYPES)} (or short names {sorted(TPU_ALIASES)})"
        )
    return TPU_TYPES[key]


def tpu_slice(name: str, topology: str) -> tuple[TpuType, TpuTopology]:
    """The TPU type and slice shape for ``(name, topology)``.

    Raises:
        UnknownAccelerator: unknown type, or a topology GKE does not offer for it (lists them).
    """
    tpu = tpu_type(name)
    if topology not in tpu.topologies:
        raise UnknownAccelerator(
            f"TPU type {tpu.gke_accelerator} ({tpu.name}) has no topology {topology!r}; "
            f"valid: {list(tpu.topologies)} (source: {PLAN_TPUS})"
        )
    return tpu, tpu.topologies[topology]


def gpu_type(name: str, count: int) -> GpuType:
    """The GPU type for a GKE accelerator name, checking that a node can hold ``count`` GPUs.

    Raises:
        UnknownAccelerator: unknown name (lists the valid ones) or a count no machine type has.
    """
    if name not in GPU_TYPES:
        raise UnknownAccelerator(f"unknown GPU type {name!r}; valid: {sorted(GPU_TYPES)} (source: {GKE_GPUS})")
    gpu = GPU_TYPES[name]
    if count not in gpu.counts:
        raise UnknownAccelerator(
            f"GPU type {name} comes with {sorted(gpu.counts)} GPUs per node, not {count} (source: {GPU_MACHINES})"
        )
    return gpu
