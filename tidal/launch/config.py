"""Where training runs (``train.resources`` of a recipe): launcher, accelerator, pod shape.

Not hashed: these change where and how fast, never what a step computes. Defined here, beside
the launchers that read them; the recipe composes them (:mod:`tidal.recipe.operations`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic import Strict as StrictType

from tidal.config import PositiveInt, Strict
from tidal.launch.resources import gpu_type, tpu_slice


class AcceleratorConfig(Strict):
    """What the training pods run on; names and shapes are checked against tidal/launch/resources.py."""

    kind: Literal["cpu", "gpu", "tpu"] = Field(default="cpu", description="cpu, gpu or tpu")
    type: str | None = Field(
        default=None, description="GKE accelerator name: tpu-v5-lite-podslice (v5e), nvidia-h100-80gb, ..."
    )
    topology: str | None = Field(default=None, description="TPU slice topology, e.g. 2x4 or 2x2x2")
    slices: PositiveInt = Field(default=1, description="TPU slices (more than 1: multislice over DCN)")
    count: PositiveInt = Field(default=1, description="GPUs per node (nvidia.com/gpu limit)")
    nodes: PositiveInt = Field(default=1, description="GPU/CPU nodes (more than 1: multi-node JobSet)")

    @model_validator(mode="after")
    def _known_hardware(self) -> AcceleratorConfig:
        if self.kind == "tpu":
            if self.type is None or self.topology is None:
                raise ValueError("a tpu accelerator needs both `type` and `topology`")
            _, topo = tpu_slice(self.type, self.topology)
            if self.slices > 1 and not topo.multi_host:
                raise ValueError(f"multislice needs multi-host slices; {self.topology} is one host (GKE Multislice)")
            if self.nodes != 1 or self.count != 1:
                raise ValueError("a tpu accelerator is sized by `topology` and `slices`, not `nodes`/`count`")
        elif self.kind == "gpu":
            if self.type is None:
                raise ValueError("a gpu accelerator needs `type`")
            gpu_type(self.type, self.count)
        elif self.type is not None or self.topology is not None:
            raise ValueError("a cpu accelerator takes no `type` or `topology`")
        return self


class ResourceConfig(Strict):
    """Where training runs. Not hashed: it changes where and how fast, not what."""

    launcher: Literal["local", "gke"] = Field(
        default="local", description="local subprocess, or pods on GKE (KubernetesPodOperator / JobSet)"
    )
    accelerator: AcceleratorConfig = AcceleratorConfig()
    spot: bool = Field(default=False, description="schedule on GKE Spot VMs (selector + toleration)")
    priority_class: str | None = Field(default=None, description="Kubernetes PriorityClass name")
    image: str = Field(default="tidal-train:latest", description="container image of the training pods")
    namespace: str = Field(default="tidal", description="Kubernetes namespace of the training pods")
    service_account: str = Field(
        default="tidal-train", description="Kubernetes service account bound to a GCP one (Workload Identity)"
    )
    deadline_seconds: PositiveInt = Field(
        default=86_400, description="activeDeadlineSeconds: the cluster kills the run after this long"
    )
    grace_seconds: PositiveInt = Field(
        default=600, description="terminationGracePeriodSeconds: time to checkpoint after SIGTERM"
    )
    max_restarts: Annotated[int, StrictType(), Field(ge=0)] = Field(
        default=3, description="JobSet failurePolicy.maxRestarts (multi-host: all workers restart together)"
    )
    cpu: str = Field(default="2", description="CPU request per pod (Kubernetes quantity)")
    memory: str = Field(default="8Gi", description="memory request = limit per pod (Kubernetes quantity)")
