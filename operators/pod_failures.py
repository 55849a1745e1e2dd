"""A failed training pod's cause as the launch task's exception: one exception class per cause, so
that the failure catalog groups by cause (its fingerprint hashes the class name), Airflow retries
only what the infrastructure did, and the message in the task log and on the on-call page says
what happened and what to change.

The cause is read from the pod as the API server has it (:func:`tidal.launch.pod_cause.pod_cause`);
the peak memory from the last ``metrics.jsonl`` the trainer uploaded with a checkpoint.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tidal.launch.pod_cause import PodCause, pod_cause

log = logging.getLogger(__name__)


class PodOOMKilled(AirflowFailException):
    """The pod was OOM-killed at its memory limit: not retried (a deterministic step would hit it again)."""


class PodEvicted(AirflowException):
    """The kubelet evicted the pod (ephemeral storage, an emptyDir past its sizeLimit, node pressure): retried."""


class PodPreempted(AirflowException):
    """The pod was preempted (Spot VM reclaimed, scheduler preemption, SIGTERM): retried, resumes."""


class PodNodeLost(AirflowException):
    """The pod's node went away: retried, resumes from the last checkpoint."""


class PodFailed(AirflowException):
    """The container exited non-zero on its own; retried as the task's ``retries`` say."""


EXCEPTIONS: dict[str, type[AirflowException]] = {
    "oom_killed": PodOOMKilled, "evicted": PodEvicted, "preempted": PodPreempted, "node_lost": PodNodeLost,
    "failed": PodFailed,
}


def last_logged_peak(metrics_jsonl: str) -> float | None:
    """The largest ``peak_memory_bytes`` in the trainer's ``metrics.jsonl`` text (bytes), None if none."""
    peak = None
    for line in metrics_jsonl.splitlines():
        try:
            value = json.loads(line).get("peak_memory_bytes")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int | float):
            peak = max(peak or 0.0, float(value))
    return peak


def _peak_of(step_uri: str | None) -> float | None:
    if not step_uri:
        return None
    from tidal.storage.uris import join, read_bytes

    try:
        return last_logged_peak(read_bytes(join(step_uri, "metrics.jsonl")).decode(errors="replace"))
    except Exception as err:  # noqa: BLE001 - the peak is a hint in a failure message, never a second failure
        log.info("no peak memory for the failure message (%s: %s)", type(err).__name__, err)
        return None


def read_pod(hook: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the API server returns it (camelCase JSON), or None when it does not exist."""
    from kubernetes.client.exceptions import ApiException

    client = hook.core_v1_client
    try:
        pod = client.read_namespaced_pod(name=name, namespace=namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return client.api_client.sanitize_for_serialization(pod)


class JobSetEvicted(AirflowFailException):
    """A JobSet spent its restarts; the most telling failure among its pods: an eviction."""


class JobSetPreempted(AirflowFailException):
    """A JobSet spent its restarts; the most telling failure among its pods: a preemption."""


class JobSetNodeLost(AirflowFailException):
    """A JobSet spent its restarts; the most telling failure among its pods: a lost node."""


class JobSetFailed(AirflowFailException):
    """A JobSet spent its restarts; its pods exited non-zero on their own (or say nothing more)."""


# no retry for any: the JobSet already restarted as its failurePolicy allows
JOBSET_EXCEPTIONS: dict[str, type[AirflowFailException]] = {
    "oom_killed": PodOOMKilled, "evicted": JobSetEvicted, "preempted": JobSetPreempted,
    "node_lost": JobSetNodeLost, "failed": JobSetFailed,
}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # set by the JobSet controller on every pod it makes
# most telling first: an OOM kill in any host is the reason a JobSet ran out of restarts
CAUSE_ORDER = ("oom_killed", "evicted", "node_lost", "preempted", "failed")


def jobset_failure(hook: Any, namespace: str, name: str, message: str) -> AirflowException:
    """The exception for a JobSet that reached ``Failed`` (its own restarts spent): the causes of its failed
    pods (:func:`tidal.launch.pod_cause.pod_cause`) appended to ``message``, as the class of the most telling
    one (an OOM kill: :class:`PodOOMKilled`); :class:`PodFailed` when no pod says more. Never retried by
    Airflow: the JobSet already retried as its ``failurePolicy`` allows. A pod list that cannot be read
    leaves ``message`` alone."""
    try:
        pods = hook.core_v1_client.list_namespaced_pod(namespace, label_selector=f"{JOBSET_LABEL}={name}")
        items = hook.core_v1_client.api_client.sanitize_for_serialization(pods).get("items") or []
    except Exception as err:  # noqa: BLE001 - the causes are a hint; the JobSet's own failure stands
        log.warning("could not list the pods of JobSet %s: %s", name, err)
        items = []
    causes = [c for c in (pod_cause(pod) for pod in items) if c.cause in CAUSE_ORDER]
    if not causes:
        return JobSetFailed(message)
    causes.sort(key=lambda c: CAUSE_ORDER.index(c.cause))
    worst = causes[0]
    lines = [message, *(f"  {c.describe()}" for c in causes[:8])]
    return JOBSET_EXCEPTIONS[worst.cause]("\n".join(lines))


def explain(pod: dict[str, Any] | None, name: str, *, step_uri: str | None = None) -> AirflowException | None:
    """The exception of ``pod``'s cause (:data:`EXCEPTIONS`), its message from :meth:`PodCause.describe`
    with the step's logged peak memory; None when the pod says nothing the provider's own error does not
    (it never terminated: a start-up timeout, an unschedulable pod) or it succeeded."""
    cause: PodCause = pod_cause(pod, name)
    if cause.cause == "succeeded" or (cause.cause == "failed" and cause.exit_code is None):
        return None
    peak = _peak_of(step_uri) if cause.cause == "oom_killed" else None
    return EXCEPTIONS[cause.cause](cause.describe(peak_memory_bytes=peak))


__all__ = [
    "EXCEPTIONS",
    "JOBSET_EXCEPTIONS",
    "JobSetEvicted",
    "JobSetFailed",
    "JobSetNodeLost",
    "JobSetPreempted",
    "PodEvicted",
    "PodFailed",
    "PodNodeLost",
    "PodOOMKilled",
    "PodPreempted",
    "explain",
    "jobset_failure",
    "last_logged_peak",
    "read_pod",
]
