"""Why a training pod ended, in one word a user can act on: the kubelet's and the control plane's
records of a pod, read as ``oom_killed``, ``evicted``, ``preempted``, ``node_lost``, ``failed`` or
``succeeded``.

Where each comes from (the pod object as the API server returns it; Kubernetes docs, "Pod Lifecycle"
and "Disruptions", section "Pod disruption conditions"; GKE, "Spot VMs", graceful node shutdown):

* ``oom_killed``: a container's ``state.terminated.reason == "OOMKilled"`` (the kernel's OOM killer
  ended it at its memory limit; exit code 137).
* ``evicted``: ``status.reason == "Evicted"`` (the kubelet evicted the pod: an ``emptyDir`` past its
  ``sizeLimit``, the pod's ephemeral storage past its limit, or node pressure); ``status.message``
  says which.
* ``preempted``: a ``DisruptionTarget`` condition with reason ``PreemptionByScheduler`` or
  ``TerminationByKubelet`` (a Spot VM's graceful shutdown, GKE), ``status.reason == "Terminated"``
  or ``"Shutdown"`` (graceful node shutdown), or the trainer's own exit code 75 after SIGTERM
  (:data:`tidal.train.preemption.EXIT_PREEMPTED`: it saved a checkpoint and stopped).
* ``node_lost``: a ``DisruptionTarget`` condition with reason ``DeletionByPodGC`` or
  ``DeletionByTaintManager`` (the node went away or became unreachable), ``status.reason ==
  "NodeLost"``, or no pod at all (deleted with its node before anyone read it).
* ``failed``: a container exited non-zero for any other reason: the program's own failure.

Infrastructure causes (evicted, preempted, node_lost) are retried. An OOM kill of a deterministic
step is not: the same step on the same limit reaches the same peak, so a retry only burns the node
pool's time; the failure names the limit, the peak the trainer last logged and the field to raise.
No Airflow import here: operators/pod_failures.py turns a cause into the task's exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXIT_PREEMPTED = 75  # tidal.train.preemption.EXIT_PREEMPTED (kept literal: launch does not import train)
PREEMPTED_REASONS = frozenset({"PreemptionByScheduler", "TerminationByKubelet"})
NODE_LOST_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})
RETRIED = frozenset({"evicted", "preempted", "node_lost"})


@dataclass(frozen=True)
class PodCause:
    """Why a pod ended.

    Attributes:
        cause: ``oom_killed`` | ``evicted`` | ``preempted`` | ``node_lost`` | ``failed`` | ``succeeded``.
        pod: the pod's name.
        node: the node it ran on ("" if it never got one, or the pod is gone).
        exit_code: the main container's exit code, when it terminated (None otherwise).
        detail: the kubelet's or control plane's own words (``status.message``, a condition's message).
        memory_limit: the main container's ``resources.limits.memory`` ("" when none).
    """

    cause: str
    pod: str
    node: str = ""
    exit_code: int | None = None
    detail: str = ""
    memory_limit: str = ""

    @property
    def retried(self) -> bool:
        """Whether a new attempt can succeed without a change: the infrastructure took the pod."""
        return self.cause in RETRIED

    def describe(self, *, peak_memory_bytes: float | None = None,
                 memory_field: str = "train.resources.memory") -> str:
        """One paragraph for the task log, the failure catalog and the on-call page.

        ``peak_memory_bytes``: the step's peak as the trainer last logged it (a lower bound of the peak
        at the kill), or None when nothing was logged. ``memory_field``: the recipe field that sets the
        limit, named in the advice.
        """
        where = f"pod {self.pod}" + (f" on node {self.node}" if self.node else "")
        code = f" (exit {self.exit_code})" if self.exit_code is not None else ""
        detail = f": {self.detail.rstrip('. ')}" if self.detail else ""  # the sentence's own full stop follows
        if self.cause == "oom_killed":
            # what to change comes first: the on-call page shows a message's first 200 characters
            peak = (f" (the trainer last logged a peak of {_gib(peak_memory_bytes)})" if peak_memory_bytes
                    else " (the trainer logged no memory before it was killed)")
            return (f"{where} was OOMKilled{code} at its memory limit {self.memory_limit or '(none set)'}{peak}: "
                    f"raise {memory_field}, or lower train.batch_size or tokenize.seq_len. Not retried: the "
                    "same step on the same limit reaches the same peak.")
        if self.cause == "evicted":
            return f"{where} was Evicted by the kubelet{detail}. Retried on a fresh node."
        if self.cause == "preempted":
            return f"{where} was preempted{code}{detail}. Retried: training resumes from its last checkpoint."
        if self.cause == "node_lost":
            return f"{where}: its node was lost{detail}. Retried: training resumes from its last checkpoint."
        if self.cause == "failed":
            return f"{where} failed{code}{detail}; the task log has the trainer's output."
        return f"{where} succeeded"


def _gib(n: float | None) -> str:
    return f"{(n or 0) / 2**30:.2f} GiB"


def _main_container(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first container's spec and status (tidal's pods have one container)."""
    spec = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == spec.get("name")), statuses[0] if statuses else {})
    return spec, status


def pod_cause(pod: dict[str, Any] | None, name: str = "") -> PodCause:
    """Classify a pod as the API server returned it (a dict in the API's camelCase field names).

    Args:
        pod: the pod object, or None when it no longer exists (gone with its node).
        name: the pod's name, for the message when ``pod`` is None.

    Returns:
        The :class:`PodCause`; ``succeeded`` when the phase is Succeeded or the container exited 0.
    """
    if pod is None:
        return PodCause("node_lost", name, detail="the pod no longer exists (deleted with its node)")
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name = meta.get("name") or name
    node = (pod.get("spec") or {}).get("nodeName") or ""
    spec, container = _main_container(pod)
    terminated = ((container.get("state") or {}).get("terminated")
                  or (container.get("lastState") or {}).get("terminated") or {})
    exit_code = terminated.get("exitCode")
    limit = str(((spec.get("resources") or {}).get("limits") or {}).get("memory") or "")
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    disruption = conditions.get("DisruptionTarget") or {}
    words = status.get("message") or disruption.get("message") or terminated.get("message") or ""
    base = {"pod": name, "node": node, "exit_code": exit_code, "memory_limit": limit}
    if terminated.get("reason") == "OOMKilled":
        return PodCause("oom_killed", detail=words.strip(), **base)
    if status.get("reason") == "Evicted":
        return PodCause("evicted", detail=words.strip(), **base)
    if disruption.get("reason") in NODE_LOST_REASONS or status.get("reason") == "NodeLost":
        return PodCause("node_lost", detail=words.strip(), **base)
    if (disruption.get("reason") in PREEMPTED_REASONS or status.get("reason") in ("Terminated", "Shutdown")
            or exit_code == EXIT_PREEMPTED):
        return PodCause("preempted", detail=words.strip(), **base)
    if status.get("phase") == "Succeeded" or exit_code == 0:
        return PodCause("succeeded", **base)
    return PodCause("failed", detail=(terminated.get("message") or words).strip(), **base)
