"""A test-only kubelet: runs a pod's container command on a fresh node of the test cluster.

KWOK (tests/cluster/kube.py) plays the node to the API server: it marks a bound pod Running and
finalizes its deletion, but runs nothing. :class:`PodRunner` does the rest of a kubelet's job for
one pod: it waits until the pod is bound and Running, boots a fresh share-nothing node
(tests/cluster/harness.py), runs the container's ``command`` + ``args`` there with the pod's
literal env, and writes the exit into the pod's status through the API (``Succeeded`` / ``Failed``,
``containerStatuses[].state.terminated.exitCode``). When the pod is deleted while it runs (as GKE
deletes a Spot VM's pods), it stops the node as a kubelet stops a container: SIGTERM to every
process, SIGKILL after the pod's ``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.cluster.harness import Cluster, _stop_group, stop_node
from tests.cluster.kube import KubeServer


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
        pod = self.wait_running(name)
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        node = f"pod-{name}"
        log = self.workdir / f"{node}.log"
        log.write_bytes(b"")
        tick = time.monotonic()
        proc = self.cluster.node(node).start([*container["command"], *container.get("args", [])], log=log, env=env)
        deleted = False
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        try:
            while proc.poll() is None:
                if time.monotonic() - tick > timeout_s:
                    raise RuntimeError(f"pod {name} ran over {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
                if on_output:
                    on_output(log.read_text(errors="replace"))
                current = self._pod(name)
                if current is None or current["metadata"].get("deletionTimestamp"):
                    deleted = True  # as the kubelet does: SIGTERM, then SIGKILL after the grace period
                    _stop_group(proc, grace_s=grace)
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                stop_node(proc, kill=True)
        if not deleted:
            self._write_exit(name, container["name"], proc.returncode)
        return PodRun(name, pod["spec"]["nodeName"], node, proc.returncode, deleted,
                      log.read_text(errors="replace"), time.monotonic() - tick)

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
