"""A test-only kubelet: runs a pod's container command on a fresh node of the test cluster.

KWOK (tests/cluster/kube.py) plays the node to the API server: it marks a bound pod Running and
finalizes its deletion, but runs nothing. :class:`PodRunner` does the rest of a kubelet's job for
one pod: it waits until the pod is bound and Running, boots a fresh share-nothing node
(tests/cluster/harness.py), runs the container's ``command`` + ``args`` there with the pod's env
(literal values and the downward API's ``fieldRef``s, as a kubelet resolves them; a pod with a
``hostname`` and ``subdomain``, as JobSet gives its pods, gets that name in the cluster's DNS), and
writes the exit into the pod's status through the API (``Succeeded`` / ``Failed``,
``containerStatuses[].state.terminated.exitCode``, reason ``OOMKilled`` when the node's memory cgroup
killed it). The node gets the pod's limits (:func:`pod_limits`): the container's memory (and CPU, when
set) limit; and, as a kubelet enforces an ``emptyDir``'s ``sizeLimit``, it watches the node's ``/tmp``
and evicts the pod once its usage passes the ``tmp`` volume's limit (status ``Failed``, reason
``Evicted``, the kubelet's message; the node's disk has room past the limit, as a node's disk does, so
the eviction, not ENOSPC, ends the pod). The container's output is also written in the CRI log format a
container runtime writes (``<time> stdout F <line>``) to the file a KWOK ``Logs`` object names for the
pod, so ``kubectl logs`` (and the KubernetesPodOperator, following it) read it through the API server
from KWOK's kubelet API (tests/cluster/kube.py). When the pod is deleted while it runs (as GKE
deletes a Spot VM's pods), it stops the node as a kubelet stops a container: SIGTERM to every
process, SIGKILL after the pod's ``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.cluster.harness import Cluster
from tests.cluster.kube import KubeServer
from tests.cluster.node import _stop_group, stop_node
from tidal.train.memory import quantity_bytes

FIELD_PATH = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")
MIB = 2**20


def _cpus(quantity: str) -> float:
    """Cores of a Kubernetes CPU quantity (``"2"``, ``"500m"``)."""
    text = str(quantity).strip()
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def pod_limits(pod: dict) -> dict[str, int | float]:
    """The node limits (:meth:`Cluster.node` keywords) a kubelet would enforce for ``pod``: ``memory_mb`` from
    the container's ``resources.limits.memory``, ``cpus`` from ``limits.cpu`` (a quota only where the pod
    sets one), ``tmpfs_mb`` from the ``tmp`` emptyDir's ``sizeLimit`` (where it is a tmpfs here)."""
    (container,) = pod["spec"]["containers"]
    limits = (container.get("resources") or {}).get("limits") or {}
    node: dict[str, int | float] = {}
    if "memory" in limits:
        node["memory_mb"] = quantity_bytes(limits["memory"]) // MIB
    if "cpu" in limits:
        node["cpus"] = _cpus(limits["cpu"])
    limit = tmp_limit(pod)
    if limit is not None:
        node["tmpfs_mb"] = 2 * limit[1] // MIB  # room past the limit: the kubelet's check ends the pod, not ENOSPC
    return node


def tmp_limit(pod: dict) -> tuple[str, int] | None:
    """The ``tmp`` emptyDir's ``sizeLimit`` as written and in bytes (tidal's pods mount it at /tmp), or None."""
    for volume in pod["spec"].get("volumes") or []:
        size = (volume.get("emptyDir") or {}).get("sizeLimit")
        if volume.get("name") == "tmp" and size:
            return str(size), quantity_bytes(size)
    return None


def _node_tmp_used(proc) -> int | None:
    """Bytes used on the ``/tmp`` of the node ``proc`` booted (seen through a process inside its mount
    namespace), or None while there is none yet."""
    own = os.readlink("/proc/self/ns/mnt")
    todo = [proc.pid]
    for _ in range(64):
        if not todo:
            return None
        pid = todo.pop(0)
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != own:
                tmp = f"/proc/{pid}/root/tmp"
                if os.stat(tmp).st_dev == os.stat("/tmp").st_dev:
                    return None  # the node's own tmpfs is not mounted yet: that is the host's /tmp
                stat = os.statvfs(tmp)
                return (stat.f_blocks - stat.f_bfree) * stat.f_frsize
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return None


class CriLog:
    """Copies a node's raw output into a CRI-format container log as it grows (``kubelet``'s
    ``<RFC 3339 time> <stream> <F|P> <content>`` lines: KWOK serves logs through the kubelet's reader)."""

    def __init__(self, raw: Path, cri: Path):
        self.raw, self.cri, self.offset, self.partial = raw, cri, 0, b""
        cri.write_bytes(b"")

    def pump(self, final: bool = False) -> None:
        """Append the raw log's new complete lines (every line at ``final``)."""
        with open(self.raw, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = b"" if final else lines.pop()
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        out = b"".join(stamp + b" stdout F " + line + b"\n" for line in lines if line or not final)
        if out:
            with open(self.cri, "ab") as f:
                f.write(out)


def _oom_killed(proc, wait_s: float = 10) -> bool:
    """Whether the node's memory cgroup OOM-killed a process of the boot ``proc`` (its :class:`NodeUsage`,
    which the node's watcher records just after the boot ends)."""
    deadline = time.monotonic() + wait_s
    while getattr(proc, "node_usage", None) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    usage = getattr(proc, "node_usage", None)
    return bool(usage and usage.oom_killed)


def pod_env(pod: dict, secret=None) -> dict[str, str]:
    """The env of ``pod``'s one container as the kubelet resolves it: ``value``s, ``fieldRef``s
    (``metadata.name``/``namespace``, ``spec.nodeName``, ``metadata.annotations['k']`` / ``labels['k']``)
    and ``secretKeyRef``s (``secret(namespace, name, key)`` reads one key of a Secret).

    Raises:
        RuntimeError: an env source this stand-in does not resolve (e.g. ``configMapKeyRef``), or a
            ``secretKeyRef`` without ``secret``; a kubelet would, so running without it would not be
            the pod's command.
    """
    (container,) = pod["spec"]["containers"]
    env = {}
    for entry in container.get("env", []):
        if "valueFrom" not in entry:  # an empty value is stored without the field; the kubelet sets ""
            env[entry["name"]] = entry.get("value", "")
            continue
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref and secret is not None:
            env[entry["name"]] = secret(pod["metadata"]["namespace"], ref["name"], ref["key"])
            continue
        path = (entry.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        plain = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                 "spec.nodeName": pod["spec"].get("nodeName", "")}
        if path in plain:
            env[entry["name"]] = plain[path]
        elif path and (match := FIELD_PATH.match(path)):
            env[entry["name"]] = pod["metadata"].get(match.group(1), {})[match.group(2)]
        else:
            raise RuntimeError(f"pod {pod['metadata']['name']}: env {entry['name']} from {entry.get('valueFrom')} "
                               "is not resolved by this test kubelet")
    return env


STORAGE_SECRET = "tidal-s3"


def storage_secret(kube: KubeServer, cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """Put the bucket's credentials in Secret ``tidal-s3`` of ``namespace`` (created or replaced) and return
    them as a pod reads them (``secret_env`` of :func:`tidal.launch.pods.workload`; JSON of it is
    ``TIDAL_POD_SECRET_ENV``): a container gets no credential its spec does not name."""
    keys = {"AWS_ACCESS_KEY_ID": "access-key-id", "AWS_SECRET_ACCESS_KEY": "secret-access-key"}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": STORAGE_SECRET, "namespace": namespace},
              "type": "Opaque", "stringData": {key: cluster.env[env] for env, key in keys.items()}}
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    return {env: (STORAGE_SECRET, key) for env, key in keys.items()}


@dataclass
class PodRun:
    """What became of one pod: the node it was bound to, the node it ran on, its exit."""

    pod: str
    bound_to: str
    ran_on: str
    returncode: int | None
    deleted: bool
    log: str
    seconds: float


class PodRunner:
    """Run the pods of ``namespace`` on ``kube`` in nodes of ``cluster``, one :meth:`run` per pod."""

    def __init__(self, kube: KubeServer, cluster: Cluster, namespace: str, workdir: Path):
        self.kube, self.cluster, self.namespace, self.workdir = kube, cluster, namespace, workdir

    def _pod(self, name: str) -> dict | None:
        return self.kube.get_path(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def wait_running(self, name: str, timeout_s: float = 120) -> dict:
        """The pod once the scheduler bound it and KWOK marked it Running; RuntimeError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pod = self._pod(name)
            if pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running":
                return pod
            time.sleep(0.2)
        raise RuntimeError(f"pod {name} not Running after {timeout_s:.0f} s: {pod and pod['status']}")

    def run(self, name: str, *, on_output=None, timeout_s: float = 900) -> PodRun:
        """Run pod ``name``'s container to its end (or until the pod is deleted) on a fresh node.

        Args:
            name: the pod, in this runner's namespace.
            on_output: called with the log text so far while it runs (a test deletes the pod from it).
            timeout_s: seconds before the node is killed and RuntimeError raised.
        """
        return self.run_all([name], on_output=on_output, timeout_s=timeout_s)[0]

    def run_all(self, names: list[str], *, on_output=None, timeout_s: float = 900) -> list[PodRun]:
        """Run the pods ``names`` side by side (the hosts of one multi-host job), each on a fresh node,
        until every one has exited or was deleted; as :meth:`run`, ``on_output`` sees the first pod's log."""
        pods = [self.wait_running(name) for name in names]
        for pod in pods:  # each pod's DNS name resolves to the node it runs on, as cluster DNS gives a pod's IP
            if pod["spec"].get("hostname") and pod["spec"].get("subdomain"):
                self.cluster.add_dns_name(f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}",
                                          f"pod-{pod['metadata']['name']}")
        tick = time.monotonic()
        started, crilogs = [], []
        for pod in pods:
            name = pod["metadata"]["name"]
            node, log = f"pod-{name}", self.workdir / f"pod-{name}.log"
            log.write_bytes(b"")
            (container,) = pod["spec"]["containers"]
            argv = [*container["command"], *container.get("args", [])]
            # the container's env is the image's and the pod spec's, nothing of the harness (a kubelet's)
            env = {**self.cluster.image_env(), **pod_env(pod, self._secret)}
            cri = CriLog(log, self.workdir / f"pod-{name}.cri.log")
            self.kube.kubectl("apply", "-f", "-", stdin=json.dumps({
                "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"logs": [{"containers": [container["name"]], "logsFile": str(cri.cri), "follow": True}]}}))
            crilogs.append(cri)
            started.append((pod, node, log, self.cluster.node(node, **pod_limits(pod)).start(
                argv, log=log, env=env, inherit=False)))
        deleted: set[str] = set()
        evicted: dict[str, str] = {}  # pod -> the kubelet's eviction message
        try:
            while any(proc.poll() is None for *_, proc in started):
                if time.monotonic() - tick > timeout_s:
                    tails = "\n".join(log.read_text()[-3000:] for _, _, log, _ in started)
                    raise RuntimeError(f"pods {names} ran over {timeout_s:.0f} s:\n{tails}")
                # what on_output sees is already in the served log: its complete lines, read before the pump
                seen = started[0][2].read_text(errors="replace")
                for cri in crilogs:
                    cri.pump()
                if on_output:
                    on_output(seen[:seen.rfind("\n") + 1])
                for pod, _, _, proc in started:
                    name = pod["metadata"]["name"]
                    if proc.poll() is not None or name in deleted:
                        continue
                    limit = tmp_limit(pod)
                    used = _node_tmp_used(proc) if limit else None
                    if used is not None and used > limit[1]:  # the kubelet's local storage check: evict, no grace
                        evicted[name] = f'Usage of EmptyDir volume "tmp" exceeds the limit "{limit[0]}". '
                        stop_node(proc, kill=True)
                        continue
                    current = self._pod(name)
                    if current is None or current["metadata"].get("deletionTimestamp"):
                        deleted.add(name)  # as the kubelet does: SIGTERM, then SIGKILL after the grace period
                        _stop_group(proc, grace_s=pod["spec"].get("terminationGracePeriodSeconds", 30))
                time.sleep(0.2)
        finally:
            for *_, proc in started:
                if proc.poll() is None:
                    stop_node(proc, kill=True)
            for cri in crilogs:
                cri.pump(final=True)
        runs = []
        for pod, node, log, proc in started:
            name = pod["metadata"]["name"]
            if name not in deleted:
                oom = _oom_killed(proc, wait_s=10 if not self.cluster.limits_skipped else 0)
                self._write_exit(name, pod["spec"]["containers"][0]["name"], proc.returncode, oom, evicted.get(name))
            runs.append(PodRun(name, pod["spec"]["nodeName"], node, proc.returncode, name in deleted,
                               log.read_text(errors="replace"), time.monotonic() - tick))
        return runs

    def _secret(self, namespace: str, name: str, key: str) -> str:
        """One key of a Secret, decoded, as the kubelet hands it to a container."""
        data = self.kube.get_json("secret", name, "-n", namespace).get("data") or {}
        if key not in data:
            raise RuntimeError(f"secret {namespace}/{name} has no key {key!r} (it has {sorted(data)})")
        return base64.b64decode(data[key]).decode()

    def _write_exit(self, name: str, container: str, code: int, oom_killed: bool = False,
                    evicted: str | None = None) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        code = 128 - code if code < 0 else code  # killed by signal N: a container runtime reports 128 + N
        reason = "Completed" if code == 0 else "OOMKilled" if oom_killed else "Error"
        pod_reason = {"reason": "Evicted", "message": evicted} if evicted else {}
        status = {"status": {
            **pod_reason,
            "phase": "Succeeded" if code == 0 and not evicted else "Failed",
            "containerStatuses": [{"name": container, "ready": False, "restartCount": 0, "image": "tidal",
                                   "imageID": "", "started": False,
                                   "state": {"terminated": {"exitCode": code, "finishedAt": now, "startedAt": now,
                                                            "reason": reason}}}],
        }}
        self.kube.kubectl("patch", "pod", name, "-n", self.namespace, "--subresource=status", "--type=merge",
                          "-p", json.dumps(status))
