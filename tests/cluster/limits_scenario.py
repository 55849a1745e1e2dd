"""What makes the test cluster's nodes as unkind as pods, as steps a test or bench/cluster_limits.py runs on
fresh nodes: a pod past its memory limit, a pod past its ``tmp`` emptyDir limit, a server on one node dialed
as ``localhost`` from another, the launcher's working tree read from a node, a pod's environment, its logs."""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

from tests.cluster.harness import REPO, Cluster, stop_node
from tests.cluster.kube import KubeServer
from tests.cluster.node_pools import node_pool
from tests.cluster.pod_runner import PodRun, PodRunner
from tidal.launch.pods import workload
from tidal.recipe import ResourceConfig

ALLOCATE = "blocks = []\nwhile True: blocks.append(bytearray(64 << 20)); print(len(blocks), flush=True)"
FILL_TMP = ("import os, time\nwith open('/tmp/fill', 'wb') as f:\n    for i in range(1 << 10):\n"
            "        f.write(os.urandom(1 << 20)); f.flush(); time.sleep(0.02)\n        print(i + 1, flush=True)")
SHOW_ENV = "import os\nfor key in sorted(os.environ): print('ENV', key)\nprint('training output: step 1 loss 9.9')"
SERVE = """
    import socket, sys
    server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
    print("listening", flush=True)
    server.settimeout(60)
    try:
        while True:
            conn, _ = server.accept()
            conn.sendall(b"node-b here")
            conn.close()
    except TimeoutError:
        pass
"""
DIAL = """
    import socket, sys
    for host in sys.argv[2:]:
        try:
            with socket.create_connection((host, int(sys.argv[1])), timeout=5) as conn:
                print(host, conn.recv(64).decode())
        except OSError as err:
            print(host, type(err).__name__)
"""


@dataclass
class PodEnd:
    run: PodRun
    pod: dict  # the pod as the API server has it after the run


def small_pod(namespace: str, command: str, *, memory: str = "256Mi",
              tmp_size: str | None = None) -> tuple[dict, ResourceConfig]:
    """tidal's training pod for a CPU node pool (:func:`tidal.launch.pods.workload`) with ``memory`` as its
    limit, running ``python -c command``; ``tmp_size``: its ``tmp`` emptyDir's ``sizeLimit`` instead of 10Gi."""
    resources = ResourceConfig.model_validate({"launcher": "gke", "accelerator": {"kind": "cpu"},
                                               "namespace": namespace, "memory": memory})
    pod = workload(resources, name=f"tidal-limits-{uuid.uuid4().hex[:6]}", step_uri="s3://tidal/none")
    pod["spec"]["containers"][0].update({"command": ["python", "-c", command], "args": []})
    if tmp_size:
        for volume in pod["spec"]["volumes"]:
            if volume["name"] == "tmp":
                volume["emptyDir"]["sizeLimit"] = tmp_size
    return pod, resources


def run_pod(cluster: Cluster, kube: KubeServer, namespace: str, tmp: Path, pod: dict,
            resources: ResourceConfig, on_output=None) -> PodEnd:
    """Create ``pod`` next to a fresh node pool for it, run it with the test kubelet (``on_output``: called
    with its output so far while it runs), read it back."""
    kube.add_nodes(node_pool(resources, f"limits-{uuid.uuid4().hex[:4]}"))
    kube.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    run = PodRunner(kube, cluster, namespace, tmp).run(pod["metadata"]["name"], on_output=on_output, timeout_s=300)
    return PodEnd(run, kube.get_json("pod", run.pod, "-n", namespace))


def printed_numbers(log: str) -> list[int]:
    """The lines of a pod's log that are a number alone (its own progress, not the shell's messages)."""
    return [int(line) for line in log.splitlines() if line.strip().isdigit()]


def dial_across_nodes(cluster: Cluster, tmp: Path, port: int = 18080) -> tuple[list[str], str]:
    """A server on a fresh node ``net-b`` bound to every address; node ``net-a`` dials it as ``localhost``,
    ``127.0.0.1``, ``net-b`` and its address; node ``net-b`` dials its own ``127.0.0.1``. Returns both
    nodes' lines (``host answer-or-error``)."""
    b = cluster.node("net-b")
    log = tmp / f"net-b-{uuid.uuid4().hex[:6]}.log"
    server = b.start([sys.executable, "-c", dedent(SERVE), str(port)], log=log)
    try:
        deadline = time.monotonic() + 60
        while b"listening" not in log.read_bytes():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server on net-b did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        seen = cluster.node("net-a").run(
            [sys.executable, "-c", dedent(DIAL), str(port), "localhost", "127.0.0.1", "net-b", b.address]).stdout
        own = b.run([sys.executable, "-c", dedent(DIAL), str(port), "127.0.0.1"]).stdout
    finally:
        stop_node(server, kill=True)
    return seen.splitlines(), own.strip()


def launcher_file_seen(cluster: Cluster) -> bool:
    """Whether a node sees a file the launcher wrote into its working tree (git ignores it) after the image."""
    marker = REPO / "test-artifacts" / f"launcher-only-{uuid.uuid4().hex[:8]}"
    marker.parent.mkdir(exist_ok=True)
    marker.write_text("the launcher's working tree")
    try:
        code = f"from pathlib import Path; print(Path({str(marker)!r}).exists())"
        return cluster.node("reader").run([sys.executable, "-c", code]).stdout.strip() == "True"
    finally:
        marker.unlink()
