"""A standalone Apache Flink cluster on the share-nothing test cluster's nodes, as Flink on Kubernetes
runs Beam Python.

* node ``flink-jm``: Flink's JobManager (a standalone session cluster: REST, RPC and blob server on
  the node's own address, ports picked free);
* node ``flink-tm-K`` for each TaskManager: the TaskManager (one slot) and, beside it, Beam's Python
  SDK worker pool (:mod:`tests.cluster.beam_pool`), bound to the node's own address, which the
  name ``beam-worker-pool`` resolves to on that node alone, as the pool is a TaskManager pod's
  sidecar on ``localhost``.

A job is submitted from any other node with :func:`tidal.data.beam_options.flink_args`: Beam's
``FlinkRunner`` uploads one uber jar (the job server jar, with the pipeline inside) to the REST
endpoint; no file crosses nodes except through the bucket. Flink and the job server jar come from
``tools/flink/install.sh`` (registry packages, cached by version; ``make test`` runs it).

Every node is a process group; :meth:`FlinkCluster.kill_taskmanager` SIGKILLs one node's whole
process tree (TaskManager, worker pool and its SDK workers), as losing the machine would.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.cluster.harness import REPO, Cluster, stop_node
from tests.storage.servers import free_port
from tidal.data.beam_options import EXTERNAL_POOL_HOST, EXTERNAL_POOL_PORT, flink_args

INSTALL = REPO / "tools" / "flink" / "install.sh"
JM_MEMORY, TM_MEMORY = "768m", "1024m"
# The test cluster's JVMs live for minutes on CI's two cores: C1 alone (no C2 recompiles of hot code) and the
# serial collector (no G1 worker threads for a heap under 1 GiB) spend less CPU than the server defaults.
# Flink's scripts read these variables in place of env.java.opts.jobmanager/taskmanager; the TaskManager
# script adds G1 only when they are unset.
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class FlinkUnavailable(RuntimeError):
    """Flink or the job server jar is not installed (run ``bash tools/flink/install.sh``), or the cluster
    did not come up in time (the message has the nodes' log tails)."""


def tools() -> tuple[Path, Path]:
    """``(FLINK_HOME, job server jar)`` as ``tools/flink/install.sh`` put them.

    Raises:
        FlinkUnavailable: they are not installed.
    """
    out = subprocess.run(["bash", str(INSTALL), "--print"], check=True, capture_output=True, text=True).stdout
    paths = dict(line.split("=", 1) for line in out.split())
    home, jar = Path(paths["FLINK_HOME"]), Path(paths["BEAM_FLINK_JOB_SERVER_JAR"])
    if not (home / ".complete").is_file() or not jar.is_file():
        raise FlinkUnavailable(f"Flink ({home}) or the Beam job server jar ({jar}) is not installed: "
                               f"run `bash {INSTALL.relative_to(REPO)}` (make test does)")
    return home, jar


def _dynamic(properties: dict[str, object]) -> str:
    return " ".join(f"-D {shlex.quote(f'{k}={v}')}" for k, v in sorted(properties.items()))


class FlinkCluster:
    """A JobManager node and ``taskmanagers`` TaskManager nodes, each with its SDK worker pool.

    Attributes:
        rest: the JobManager's REST endpoint (``<flink-jm's address>:port``): ``--flink_master``.
        job_server_jar: the uber jar's base (``--flink_job_server_jar``).
    """

    def __init__(self, cluster: Cluster, workdir: Path, env: dict[str, str] | None = None):
        self.cluster = cluster
        self.env = dict(env or {})  # extra environment of the TaskManager nodes (their SDK workers)
        self.workdir = Path(workdir)
        self.home, self.job_server_jar = tools()
        self.jm_address = cluster.node("flink-jm").address
        self.rest = f"{self.jm_address}:{free_port()}"
        self.rpc_port, self.blob_port = free_port(), free_port()
        self.jobmanager: subprocess.Popen | None = None
        self.taskmanagers: dict[str, subprocess.Popen] = {}

    @classmethod
    def start(cls, cluster: Cluster, workdir: Path, *, taskmanagers: int = 2, timeout_s: float = 180,
              env: dict[str, str] | None = None) -> FlinkCluster:
        """Boot the JobManager node and ``taskmanagers`` TaskManager nodes (``env``: extra environment
        of the TaskManager nodes, e.g. a counting proxy as the S3 endpoint); return once every
        TaskManager has registered (REST ``/overview``).

        Raises:
            FlinkUnavailable: tools missing, or the cluster not up within ``timeout_s`` (log tails).
        """
        flink = cls(cluster, workdir, env)
        flink.workdir.mkdir(parents=True, exist_ok=True)
        try:
            flink.jobmanager = cluster.node("flink-jm").start(
                ["bash", "-c", flink._script("jobmanager", flink._common())], log=flink.workdir / "flink-jm.log")
            for k in range(1, taskmanagers + 1):
                flink.add_taskmanager(f"flink-tm-{k}")
            flink.wait(taskmanagers, timeout_s)
        except BaseException:
            flink.stop()
            raise
        return flink

    def _common(self) -> dict[str, object]:
        # advertised at the JobManager node's address, bound to all of that node's own addresses: the job's main
        # runs inside the JobManager and uploads to its blob server as ``localhost``, as in a JobManager pod
        jm = self.jm_address
        return {"jobmanager.rpc.address": jm, "jobmanager.rpc.port": self.rpc_port,
                "jobmanager.bind-host": "0.0.0.0", "rest.address": jm,
                "rest.bind-address": "0.0.0.0", "rest.port": self.rest.rsplit(":", 1)[1],
                "blob.server.port": self.blob_port, "jobmanager.memory.process.size": JM_MEMORY,
                "taskmanager.memory.process.size": TM_MEMORY, "taskmanager.numberOfTaskSlots": 1,
                # a 1 GiB TaskManager has 508 network buffers; the sort shuffle asks 512 by default
                "taskmanager.network.sort-shuffle.min-buffers": 64,
                "jobmanager.execution.failover-strategy": "region", "cluster.evenly-spread-out-slots": "true",
                "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3,
                "restart-strategy.fixed-delay.delay": "2 s", "heartbeat.timeout": 15000,
                "heartbeat.interval": 2000, "io.tmp.dirs": "/tmp/flink", "web.tmpdir": "/tmp/flink",
                "blob.storage.directory": "/tmp/flink"}

    def _script(self, role: str, properties: dict[str, object], before: str = "") -> str:
        """The node's command: Flink's own ``{role}.sh start-foreground`` (it ``exec``s the JVM, logging
        to stdout), its conf from the tools cache, its scratch in the node's private /tmp."""
        home = shlex.quote(str(self.home))
        # `;` after the export, not `&&`: `a && export ... && pool &` would run the export in the pool's
        # background subshell, and the TaskManager would start without it
        return (f"mkdir -p /tmp/flink /tmp/flink-log || exit 1; export FLINK_HOME={home} FLINK_CONF_DIR={home}/conf "
                f"FLINK_LOG_DIR=/tmp/flink-log FLINK_PID_DIR=/tmp/flink FLINK_ENV_JAVA_OPTS_JM='{JVM_OPTS}' "
                f"FLINK_ENV_JAVA_OPTS_TM='{JVM_OPTS}'; {before}"
                f"exec {home}/bin/{role}.sh start-foreground {_dynamic(properties)}")

    def add_taskmanager(self, name: str) -> None:
        """Boot TaskManager node ``name`` (a TaskManager and its SDK worker pool); it registers with the
        JobManager on its own (a fresh node after a lost one: what a Kubernetes Deployment does)."""
        node = self.cluster.node(name, aliases=[EXTERNAL_POOL_HOST])
        pool = (f"python -m tests.cluster.beam_pool --address {node.address} --port {EXTERNAL_POOL_PORT} "
                "2>&1 | sed -u 's/^/[pool] /' & ")
        properties = {**self._common(), "taskmanager.host": node.address, "taskmanager.bind-host": node.address,
                      "taskmanager.resource-id": name}
        self.taskmanagers[name] = node.start(["bash", "-c", self._script("taskmanager", properties, pool)],
                                             log=self.workdir / f"{name}.log", env=self.env)

    def overview(self) -> dict:
        """The JobManager's REST ``/overview`` (taskmanagers, slots, jobs)."""
        return self.rest_get("/overview")

    def rest_get(self, path: str) -> dict:
        """GET ``http://{rest}{path}`` as JSON (``/jobs/overview``, ``/jobs/{id}/vertices/{vid}`` ...)."""
        with urllib.request.urlopen(f"http://{self.rest}{path}", timeout=10) as response:
            return json.load(response)

    def wait(self, taskmanagers: int, timeout_s: float = 180) -> None:
        """Block until ``taskmanagers`` TaskManagers are registered.

        Raises:
            FlinkUnavailable: not within ``timeout_s``, or a node exited (the message has the log tails).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.overview().get("taskmanagers") == taskmanagers:
                    return
            except OSError:
                pass
            nodes = [self.jobmanager, *self.taskmanagers.values()]
            if any(p is not None and p.poll() is not None for p in nodes):
                break
            time.sleep(0.5)
        raise FlinkUnavailable(f"Flink cluster: {taskmanagers} TaskManagers not registered within {timeout_s} s\n"
                               + self.log_tails())

    def log_tails(self, chars: int = 3000) -> str:
        """The last ``chars`` of every node's log."""
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted(self.workdir.glob("*.log")))

    def args(self, parallelism: int | None = None) -> list[str]:
        """Pipeline options that run a job here (:func:`tidal.data.beam_options.flink_args`), at
        ``parallelism`` (default: one per TaskManager)."""
        return flink_args(self.rest, parallelism or len(self.taskmanagers), str(self.job_server_jar))

    def kill_taskmanager(self, name: str) -> None:
        """SIGKILL TaskManager node ``name``'s whole process tree (the machine is lost)."""
        stop_node(self.taskmanagers.pop(name), kill=True)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after a grace). Safe to call twice."""
        for name in list(self.taskmanagers):
            stop_node(self.taskmanagers.pop(name))
        if self.jobmanager is not None:
            stop_node(self.jobmanager)
            self.jobmanager = None


__all__ = ["FlinkCluster", "FlinkUnavailable", "tools"]
