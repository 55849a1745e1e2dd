"""A test-only kubelet: runs a pod's container command on a fresh node of the test cluster.

KWOK (tests/cluster/kube.py) plays the node to the API server: it marks a bound pod Running and
finalizes its deletion, but runs nothing. :class:`PodRunner` does the rest of a kubelet's job for
one pod: it waits until the pod is bound and Running, boots a fresh share-nothing node
(tests/cluster/harness.py), runs the container's ``command`` + ``args`` there with the pod's env
(literal values and the downward API's ``fieldRef``s, as a kubelet resolves them; a pod with a
``hostname`` and ``subdomain``, as JobSet gives its pods, gets that name in the cluster's DNS), and
writes the exit into the pod's status through the API (``Succeeded`` / ``Failed``,
``containerStatuses[].state.terminated.exitCode``). When the pod is deleted while it runs (as GKE
deletes a Spot VM's pods), it stops the node as a kubelet stops a container: SIGTERM to every
process, SIGKILL after the pod's ``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.cluster.harness import Cluster, _stop_group, stop_node
from tests.cluster.kube import KubeServer

FIELD_PATH = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")


def pod_env(pod: dict) -> dict[str, str]:
    """The env of ``pod``'s one container as the kubelet resolves it: ``value``s and ``fieldRef``s
    (``metadata.name``/``namespace``, ``spec.nodeName``, ``metadata.annotations['k']`` / ``labels['k']``).

    Raises:
        RuntimeError: an env source this stand-in does not resolve (e.g. ``secretKeyRef``); a kubelet
            would, so running without it would not be the pod's command.
    """
    (container,) = pod["spec"]["containers"]
    env = {}
    for entry in container.get("env", []):
        if "valueFrom" not in entry:  # an empty value is stored without the field; the kubelet sets ""
            env[entry["name"]] = entry.get("value", "")
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
        result = self.kube.kubectl("get", "pod", name, "-n", self.namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise RuntimeError(result.stderr)
        return json.loads(result.stdout)

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
        for pod in pods:
            if pod["spec"].get("hostname") and pod["spec"].get("subdomain"):
                self.cluster.add_dns_name(f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}")
        tick = time.monotonic()
        started = []
        for pod in pods:
            name = pod["metadata"]["name"]
            node, log = f"pod-{name}", self.workdir / f"pod-{name}.log"
            log.write_bytes(b"")
            (container,) = pod["spec"]["containers"]
            argv = [*container["command"], *container.get("args", [])]
            started.append((pod, node, log, self.cluster.node(node).start(argv, log=log, env=pod_env(pod))))
        deleted: set[str] = set()
        try:
            while any(proc.poll() is None for *_, proc in started):
                if time.monotonic() - tick > timeout_s:
                    tails = "\n".join(log.read_text()[-3000:] for _, _, log, _ in started)
                    raise RuntimeError(f"pods {names} ran over {timeout_s:.0f} s:\n{tails}")
                if on_output:
                    on_output(started[0][2].read_text(errors="replace"))
                for pod, _, _, proc in started:
                    name = pod["metadata"]["name"]
                    if proc.poll() is not None or name in deleted:
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
        runs = []
        for pod, node, log, proc in started:
            name = pod["metadata"]["name"]
            if name not in deleted:
                self._write_exit(name, pod["spec"]["containers"][0]["name"], proc.returncode)
            runs.append(PodRun(name, pod["spec"]["nodeName"], node, proc.returncode, name in deleted,
                               log.read_text(errors="replace"), time.monotonic() - tick))
        return runs

    def _write_exit(self, name: str, container: str, code: int) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": container, "ready": False, "restartCount": 0, "image": "tidal",
                                   "imageID": "", "started": False,
                                   "state": {"terminated": {"exitCode": code, "finishedAt": now, "startedAt": now,
                                                            "reason": "Completed" if code == 0 else "Error"}}}],
        }}
        self.kube.kubectl("patch", "pod", name, "-n", self.namespace, "--subresource=status", "--type=merge",
                          "-p", json.dumps(status))
