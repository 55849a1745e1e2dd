"""The hardened-pod rules, as a check any manifest (Pod, Job, JobSet) can be put through.

Invariant: every pod tidal launches passes :func:`violations` with an empty list. The rules
follow the Kubernetes "restricted" Pod Security Standard plus two of our own (no
service-account token, no secret values in env literals):

* pod and container ``runAsNonRoot``; seccomp ``RuntimeDefault``;
* ``allowPrivilegeEscalation: false``, not ``privileged``, capabilities ``drop: [ALL]``;
* ``readOnlyRootFilesystem: true``, and every mount is a declared ``emptyDir`` (or other
  declared volume), never a ``hostPath``; no host network, PID or IPC;
* ``automountServiceAccountToken: false`` and a named service account (Workload Identity);
* every env var is a plain literal whose name does not look like a secret, or comes from a
  ``secretKeyRef`` / ``fieldRef``; never ``configMapKeyRef``-ed secrets or ``envFrom``.

Source: https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tidal.launch.pods import SECRET_NAME_PATTERN


def pod_specs(manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each pod spec in a Pod, Job or JobSet manifest, with a path naming where it sits."""
    kind = manifest.get("kind")
    if kind == "Pod":
        yield "spec", manifest["spec"]
    elif kind == "Job":
        yield "spec.template.spec", manifest["spec"]["template"]["spec"]
    elif kind == "JobSet":
        for i, rjob in enumerate(manifest["spec"]["replicatedJobs"]):
            yield f"spec.replicatedJobs[{i}].template.spec.template.spec", rjob["template"]["spec"]["template"]["spec"]
    else:
        raise ValueError(f"no pod specs known in a {kind!r}; expected Pod, Job or JobSet")


def violations(manifest: dict[str, Any]) -> list[str]:
    """Every broken hardening rule in ``manifest`` as ``"path: rule"``; empty when hardened."""
    out: list[str] = []
    for path, spec in pod_specs(manifest):
        out += [f"{path}: {rule}" for rule in _pod_rules(spec)]
    return out


def _pod_rules(spec: dict[str, Any]) -> Iterator[str]:
    psc = spec.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True:
        yield "securityContext.runAsNonRoot must be true"
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        yield "securityContext.seccompProfile.type must be RuntimeDefault"
    if spec.get("automountServiceAccountToken") is not False:
        yield "automountServiceAccountToken must be false"
    if not spec.get("serviceAccountName"):
        yield "serviceAccountName must name the Workload Identity service account"
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            yield f"{flag} must be off"
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for name, volume in volumes.items():
        if "hostPath" in volume:
            yield f"volume {name!r} must not be a hostPath"
    for container in [*(spec.get("initContainers") or []), *spec.get("containers", [])]:
        cname = container.get("name", "?")
        csc = container.get("securityContext") or {}
        if csc.get("allowPrivilegeEscalation") is not False:
            yield f"container {cname}: allowPrivilegeEscalation must be false"
        if csc.get("privileged"):
            yield f"container {cname}: must not be privileged"
        if csc.get("readOnlyRootFilesystem") is not True:
            yield f"container {cname}: readOnlyRootFilesystem must be true"
        if (csc.get("capabilities") or {}).get("drop") != ["ALL"] or (csc.get("capabilities") or {}).get("add"):
            yield f"container {cname}: capabilities must drop ALL and add none"
        if csc.get("runAsNonRoot") is False or csc.get("runAsUser") == 0:
            yield f"container {cname}: must not run as root"
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
        for needed in ("/tmp",):
            if needed not in mounts:
                yield f"container {cname}: needs a writable emptyDir at {needed}"
        for mpath, vname in mounts.items():
            if vname not in volumes:
                yield f"container {cname}: mount {mpath} names undeclared volume {vname!r}"
        if container.get("envFrom"):
            yield f"container {cname}: envFrom is not allowed (name each variable)"
        for var in container.get("env") or []:
            source = var.get("valueFrom")
            if source is None and SECRET_NAME_PATTERN.search(var["name"]):
                yield f"container {cname}: env {var['name']} looks like a secret in a literal; use secretKeyRef"
            if source is not None and not ({"secretKeyRef", "fieldRef"} >= set(source)):
                yield f"container {cname}: env {var['name']} may come only from secretKeyRef or fieldRef"
