"""Kubernetes workloads for the training entrypoint: a Pod, or a JobSet of Indexed Jobs.

Invariant: the container runs exactly the local command, ``python -m tidal.train STEP_URI``
(:func:`tidal.launch.local.entrypoint_command` without the interpreter path), with the same
``PYTHONUNBUFFERED`` environment; a launcher only decides where and how many. Everything
hardware-specific is read from the tables in :mod:`tidal.launch.resources`; every manifest is
plain JSON data (dicts, lists, strings, ints), so it can be validated against the Kubernetes
OpenAPI schema, diffed against golden YAML, and handed to any client unchanged.

Shapes (GKE "Plan TPUs", "Deploy TPU Multislice", JobSet v1alpha2 API):

* one pod: CPU, GPU on one node, or a single-host TPU slice (``hosts == 1``);
* a JobSet with one replicated job ``slice`` of ``slices`` replicas, each an Indexed Job of
  ``hosts`` pods: multi-host TPU slices and multislice. GKE's TPU webhook injects
  ``TPU_WORKER_ID`` / ``TPU_WORKER_HOSTNAMES`` (and ``MEGASCALE_*`` for multislice) into pods
  of an Indexed Job with stable hostnames, so ``jax.distributed.initialize()`` takes no
  arguments. The JobSet gives the headless service and hostnames and restarts all workers
  together (``failurePolicy.maxRestarts``), which a TPU slice needs;
* a JobSet with one replicated job ``workers`` of ``nodes`` pods: multi-node GPU/CPU, with
  ``JAX_COORDINATOR_ADDRESS`` (pod 0's stable hostname), ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` (the Job completion index, through the downward API).

Live metrics: a training pod logs into the MLflow run its launcher opened when its env has
``MLFLOW_TRACKING_URI`` and ``TIDAL_MLFLOW_RUN_ID`` (:mod:`tidal.train.metrics`);
:func:`live_metrics_env` gives both, only for a tracking server a pod can reach
(:func:`pod_tracking_uri`). An empty value means no live metrics.

Hardening (checked on every manifest by :func:`tidal.launch.hardening.violations`): non-root
uid 1000, read-only root file system with ``emptyDir`` at ``/tmp`` and ``/dev/shm``, no
privilege escalation, all capabilities dropped, seccomp ``RuntimeDefault``, no service-account
token (Workload Identity reaches buckets through the GKE metadata server without one), and
secrets only through ``secretKeyRef``.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tidal.launch.config import ResourceConfig
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
from tidal.settings import MLFLOW_RUN_ID_ENV as RUN_ID_ENV
from tidal.settings import TRACKING_URI_ENV as URI_ENV

POD_COMMAND = ("python", "-m", "tidal.train")
CONTAINER = "train"
UID = 1000
COORDINATOR_PORT = 8476
TPU_RUNTIME_PORT = 8471
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TMP_SIZE = "10Gi"
SHM_SIZE = "1Gi"
# A JobSet pod's hostname is {jobset}-{replicated job}-{job index}-{pod index}: keep it <= 63.
MAX_JOBSET_NAME = 40
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
POD_SECRET_ENV_VAR = "TIDAL_POD_SECRET_ENV"  # the deployment's pod secrets (pod_secret_env)
_OWN_ENV = {"PYTHONUNBUFFERED", "HOME", "XDG_CACHE_HOME", URI_ENV, RUN_ID_ENV}
# an MLflow tracking server: http(s), a host, no user info (credentials go by secret_env), no
# quotes or spaces (the value may be templated into a YAML body)
_SERVER_URI = re.compile(r"https?://[^\s'\"@/?#]+(/[^\s'\"@?#]*)?", re.IGNORECASE)  # fullmatch: no query, fragment
SECRET_NAME_PATTERN = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY)",
                                 re.IGNORECASE)


class SpecError(ValueError):
    """A workload cannot be built as asked (bad name, secret in a literal env var)."""


def pod_count(resources: ResourceConfig) -> tuple[int, int]:
    """``(replicas, pods per replica)`` of the workload: ``(1, 1)`` means a single pod.

    TPU: ``(slices, hosts per slice)``; GPU/CPU: ``(1, nodes)``.
    """
    acc = resources.accelerator
    if acc.kind == "tpu":
        _, topo = tpu_slice(acc.type, acc.topology)
        return acc.slices, topo.hosts
    return 1, acc.nodes


def is_single_pod(resources: ResourceConfig) -> bool:
    """True when the workload is one pod (KubernetesPodOperator); else a JobSet."""
    return pod_count(resources) == (1, 1)


def pod_tracking_uri(uri: str | None) -> str | None:
    """``uri`` when a training pod can log live metrics to it, else None (never raises).

    Accepted: an MLflow tracking server, ``http(s)://host[:port][/path]`` (scheme in any case,
    returned lower-cased; e.g. the chart's ``http://tidal-mlflow.<namespace>.svc:5000``: pods
    run in the training namespace, so a bare Service name of another namespace does not
    resolve there). Refused (None): no URI; a local store (``sqlite:``, ``file:``, a plain
    path: its files are on the Airflow worker, not in the pod); a server on the worker's
    loopback (``localhost``, ``127.0.0.0/8``, ``[::1]``, IPv4-mapped loopback, ``0.0.0.0``: in
    a pod that is the pod itself); a database URI (``postgresql://`` ...: the pod would need
    the driver and the database password in a literal env var); a URI with user info, a query
    string or a fragment (secrets do not go into pod specs; credentials go by ``secret_env``),
    quotes, whitespace or control characters; no host, or a port that is not 1..65535; a URI
    Python cannot parse. The host is judged as written, never resolved (the pod's DNS is not ours).
    """
    if not uri or not _SERVER_URI.fullmatch(uri):
        return None
    try:
        parts = urlsplit(uri)
        port = parts.port  # ValueError when not a number in 0..65535
        host = (parts.hostname or "").rstrip(".")
    except ValueError:
        return None
    if not host or port == 0 or host == "localhost" or host.endswith(".localhost"):
        return None
    uri = parts._replace(scheme=parts.scheme.lower()).geturl()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return uri
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return None if address.is_loopback or address.is_unspecified else uri


def uri_scheme(uri: str | None) -> str:
    """The scheme of ``uri`` for a log line (``"no scheme"`` when it has none): never anything
    after it, which may hold a password."""
    if not uri:
        return "no URI"
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
    return match.group(1).lower() if match else "no scheme"


def pod_secret_env(value: str | None, source: str = POD_SECRET_ENV_VAR) -> dict[str, tuple[str, str]]:
    """Secrets a training pod reads through ``secretKeyRef``, from the deployment's setting.

    ``value`` (the ``TIDAL_POD_SECRET_ENV`` variable of the Airflow components: the DAG file
    builds the manifests when it is parsed) is a JSON object ``{"ENV_NAME": ["secret name",
    "key"]}``, e.g. ``{"MLFLOW_TRACKING_TOKEN": ["tidal-mlflow-auth", "token"]}`` for an MLflow
    server behind token auth (MLflow's client reads ``MLFLOW_TRACKING_TOKEN``, or
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``). Empty or unset: no secret.
    Names follow Kubernetes: env names are C identifiers, secret names DNS-1123 subdomains, keys
    ``[-._a-zA-Z0-9]+``; the variables tidal sets itself cannot be overridden.

    Raises:
        SpecError: naming ``source`` and the entry, for bad JSON, a wrong shape or a bad name.
    """
    if not value or not value.strip():
        return {}
    try:
        data = json.loads(value)
    except json.JSONDecodeError as err:
        raise SpecError(f"{source} is not JSON ({err.msg} at character {err.pos}); expected "
                        '{"ENV_NAME": ["secret name", "key"]}') from None
    if not isinstance(data, dict):
        raise SpecError(f"{source} must be a JSON object {{\"ENV_NAME\": [\"secret name\", \"key\"]}}, "
                        f"got {type(data).__name__}")
    out: dict[str, tuple[str, str]] = {}
    for name, ref in data.items():
        if not _ENV_NAME.fullmatch(name):
            raise SpecError(f"{source}: {name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in _OWN_ENV or name.startswith("JAX_"):
            raise SpecError(f"{source}: {name!r} is set by tidal itself and cannot come from a secret")
        if not (isinstance(ref, list) and len(ref) == 2 and all(isinstance(x, str) for x in ref)):
            raise SpecError(f"{source}: {name!r} must map to [\"secret name\", \"key\"], got {ref!r}")
        secret, key = ref
        if len(secret) > 253 or not _DNS_SUBDOMAIN.fullmatch(secret):
            raise SpecError(f"{source}: {name!r}: secret name {secret!r} is not a DNS-1123 subdomain")
        if len(key) > 253 or not _SECRET_KEY.fullmatch(key):
            raise SpecError(f"{source}: {name!r}: secret key {key!r} must match [-._a-zA-Z0-9]+")
        out[name] = (secret, key)
    return out


def storage_env(root: str, endpoint_url: str | None, region: str | None,
                gcs_endpoint_url: str | None = None) -> dict[str, str]:
    """The plain env a pod needs to reach the storage root (docs/architecture.md §0): the root, the S3 endpoint
    (``TIDAL_S3_ENDPOINT_URL``; GCS's S3-interoperable endpoint for ``gs://``), the region and, for a
    ``gs://`` root, the JSON API's endpoint when it is not Google's (``TIDAL_GCS_ENDPOINT_URL``). No
    credentials: those come by ``secretKeyRef`` (:func:`pod_secret_env`: ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` from a Secret; GCS HMAC keys the same way) or Workload Identity.

    A local root gives ``{}``: it works only where every pod mounts that volume at the same path
    (one machine, tests); a real deployment uses a bucket.
    """
    if "://" not in root or root.startswith("file://"):
        return {}
    env = {"TIDAL_STORAGE_ROOT": root}
    if endpoint_url:
        env["TIDAL_S3_ENDPOINT_URL"] = endpoint_url
    if region:
        env["AWS_DEFAULT_REGION"] = region
    if gcs_endpoint_url and root.startswith("gs://"):
        env["TIDAL_GCS_ENDPOINT_URL"] = gcs_endpoint_url
    return env


def live_metrics_env(tracking_uri: str | None, run_id: str | None) -> dict[str, str]:
    """The env that makes a training pod log live into MLflow run ``run_id``, for ``workload(env=...)``.

    Returns:
        ``{"MLFLOW_TRACKING_URI": uri, "TIDAL_MLFLOW_RUN_ID": run_id}``, or ``{}`` (no live
        metrics; the step's run is recorded when it commits) when ``run_id`` is empty or
        :func:`pod_tracking_uri` refuses ``tracking_uri``.
    """
    uri = pod_tracking_uri(tracking_uri)
    if uri is None or not run_id:
        return {}
    return {URI_ENV: uri, RUN_ID_ENV: run_id}


def workload(resources: ResourceConfig, *, name: str, step_uri: str, labels: Mapping[str, str] | None = None,
             env: Mapping[str, str] | None = None,
             secret_env: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """The manifest that trains ``step_uri`` on ``resources``: a ``v1/Pod`` or a JobSet.

    Args:
        resources: the recipe's ``train.resources``.
        name: workload name, a DNS-1123 label (at most 40 characters for a JobSet).
        step_uri: the step directory holding ``spec.json`` (the entrypoint's one argument).
        labels: extra labels for every object and pod (e.g. step id, recipe), to find them again.
        env: extra plain environment variables; names that look like secrets are refused.
        secret_env: env var name -> ``(secret name, key)``, injected with ``secretKeyRef``.

    Raises:
        SpecError: bad name or a secret-looking literal env var.
        tidal.launch.resources.UnknownAccelerator: hardware not in the tables.
    """
    if is_single_pod(resources):
        return pod_manifest(resources, name=name, step_uri=step_uri, labels=labels, env=env, secret_env=secret_env)
    return jobset(resources, name=name, step_uri=step_uri, labels=labels, env=env, secret_env=secret_env)


def pod_manifest(resources: ResourceConfig, *, name: str, step_uri: str, labels: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None,
                 secret_env: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """A single ``v1/Pod`` (restartPolicy Never; Airflow task retries restart it)."""
    _check_name(name, 63)
    all_labels = _labels(labels)
    spec = pod_spec(resources, step_uri=step_uri, env=env, secret_env=secret_env)
    spec["activeDeadlineSeconds"] = resources.deadline_seconds
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": resources.namespace, "labels": all_labels},
            "spec": spec}


def indexed_job(resources: ResourceConfig, *, name: str, step_uri: str, pods: int,
                labels: Mapping[str, str] | None = None, extra_env: list[dict[str, Any]] | None = None,
                env: Mapping[str, str] | None = None,
                secret_env: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """A ``batch/v1`` Indexed Job of ``pods`` pods that all run at once and all must succeed.

    Used as the job template of a JobSet replicated job; on its own it needs a headless
    Service and ``subdomain`` for stable hostnames (JobSet provides both).
    """
    _check_name(name, 63)
    all_labels = _labels(labels)
    spec = pod_spec(resources, step_uri=step_uri, env=env, secret_env=secret_env, extra_env=extra_env)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": resources.namespace, "labels": all_labels},
            "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed",
                     "backoffLimit": 0, "activeDeadlineSeconds": resources.deadline_seconds,
                     "template": {"metadata": {"labels": dict(all_labels)}, "spec": spec}}}


def jobset(resources: ResourceConfig, *, name: str, step_uri: str, labels: Mapping[str, str] | None = None,
           env: Mapping[str, str] | None = None,
           secret_env: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """A ``jobset.x-k8s.io/v1alpha2`` JobSet: one replicated job of Indexed Jobs (see module doc)."""
    _check_name(name, MAX_JOBSET_NAME)
    replicas, pods = pod_count(resources)
    tpu = resources.accelerator.kind == "tpu"
    rjob = "slice" if tpu else "workers"
    extra_env = [] if tpu else _coordinator_env(name, rjob, pods)
    job = indexed_job(resources, name=rjob, step_uri=step_uri, pods=pods, labels=labels,
                      extra_env=extra_env, env=env, secret_env=secret_env)
    annotations = {EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"} if tpu else {}
    metadata = {"name": name, "namespace": resources.namespace, "labels": _labels(labels)}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata,
            "spec": {"failurePolicy": {"maxRestarts": resources.max_restarts},
                     "network": {"enableDNSHostnames": True},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": [rjob]},
                     "replicatedJobs": [{"name": rjob, "replicas": replicas,
                                         "template": {"metadata": {"labels": dict(job["metadata"]["labels"])},
                                                      "spec": job["spec"]}}]}}


def pod_spec(resources: ResourceConfig, *, step_uri: str, env: Mapping[str, str] | None = None,
             secret_env: Mapping[str, tuple[str, str]] | None = None,
             extra_env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The hardened pod spec shared by every workload shape (no ``activeDeadlineSeconds``:
    a Pod carries it itself, a Job in its own spec)."""
    selector, tolerations, extended, ports = _placement(resources)
    requests = {"cpu": resources.cpu, "memory": resources.memory, **extended}
    limits = {"memory": resources.memory, **extended}
    container = {
        "name": CONTAINER,
        "image": resources.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(POD_COMMAND),
        "args": [step_uri],
        "env": _env(env, secret_env, extra_env),
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if ports:
        container["ports"] = [{"containerPort": port, "name": pname} for pname, port in ports]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": resources.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": resources.grace_seconds,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}],
    }
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if resources.priority_class:
        spec["priorityClassName"] = resources.priority_class
    return spec


def _placement(resources: ResourceConfig):
    """nodeSelector, tolerations, extended resources and named ports from the hardware tables."""
    acc = resources.accelerator
    selector: dict[str, str] = {}
    tolerations: list[dict[str, str]] = []
    extended: dict[str, str] = {}
    ports: list[tuple[str, int]] = []
    if acc.kind == "tpu":
        tpu, topo = tpu_slice(acc.type, acc.topology)
        selector |= {TPU_ACCELERATOR_LABEL: tpu.gke_accelerator, TPU_TOPOLOGY_LABEL: topo.topology}
        tolerations.append({"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        extended[TPU_RESOURCE] = str(topo.chips_per_host)
        if topo.multi_host or acc.slices > 1:
            ports.append(("tpu-runtime", TPU_RUNTIME_PORT))
    elif acc.kind == "gpu":
        gpu = gpu_type(acc.type, acc.count)
        selector[GPU_ACCELERATOR_LABEL] = gpu.gke_accelerator
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        extended[GPU_RESOURCE] = str(acc.count)
    if acc.kind != "tpu" and acc.nodes > 1:
        ports.append(("coordinator", COORDINATOR_PORT))
    if resources.spot:
        selector[SPOT_LABEL] = "true"
        tolerations.append({"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    return selector, tolerations, extended, ports


def _coordinator_env(jobset_name: str, rjob: str, pods: int) -> list[dict[str, Any]]:
    """JAX multi-process env for GPU/CPU: pod 0 of job 0 coordinates (JobSet stable DNS)."""
    host = f"{jobset_name}-{rjob}-0-0.{jobset_name}"
    return [{"name": "JAX_COORDINATOR_ADDRESS", "value": f"{host}:{COORDINATOR_PORT}"},
            {"name": "JAX_NUM_PROCESSES", "value": str(pods)},
            {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}]


def _env(env: Mapping[str, str] | None, secret_env: Mapping[str, tuple[str, str]] | None,
         extra_env: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    base = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/.cache"}
    for key, value in (env or {}).items():
        if SECRET_NAME_PATTERN.search(key):
            raise SpecError(f"env var {key!r} looks like a secret: pass it as secret_env "
                            f"{{{key!r}: (secret_name, key)}} so it is read through secretKeyRef")
        base[key] = value
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(base.items())]
    out += extra_env or []
    for key, (secret, item) in sorted((secret_env or {}).items()):
        out.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": item}}})
    return out


def _labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    return {"app.kubernetes.io/name": "tidal", "app.kubernetes.io/component": "train", **(labels or {})}


def _check_name(name: str, limit: int) -> None:
    if len(name) > limit or not _DNS_LABEL.match(name):
        raise SpecError(f"workload name {name!r} must be a DNS-1123 label of at most {limit} characters "
                        "(lower-case letters, digits, '-'; starting with a letter)")
