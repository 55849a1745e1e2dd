"""A share-nothing test cluster on one machine: namespaced "nodes" that share only the bucket,
PostgreSQL and the MLflow server.

Invariant: a node can hand another node (or the test process) nothing except through the shared
services. Each :meth:`Node.run` is a fresh process tree in its own mount, UTS, IPC and PID namespaces
(``unshare``) inside the node's network namespace (``nsenter``; tests/cluster/network.py): its own
hostname, its own SysV IPC objects, a private tmpfs over every place a program writes scratch
(``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/var/cache`` with the storage cache, ``~/.cache``,
``~/.config``), and the rest of the disk read-only. The checkout's path shows the cluster's image
(tests/cluster/image.py: the tracked files and the venv), not the launcher's working tree. When the
command ends the namespace's init exits, so every process the node started dies and its tmpfs
mounts go with it. The network namespace is the node's own, kept across its boots: its own ``localhost``
and one address on the cluster's bridge, which every node's name resolves to on every node (and each
JobSet pod's DNS name to its pod's node). Nodes reach the shared services at the bridge's gateway
address, as pods reach a bucket, a database and a tracking server by address; nothing else is routed.

Each boot runs under kernel-enforced limits (:class:`~tests.cluster.limits.NodeLimits`, set per node by
:meth:`Cluster.node`): a cgroup v1 memory limit (past it the OOM killer kills: exit 137), a CFS CPU
quota, and a size on each private tmpfs (past it: ENOSPC). Every boot's peak memory and OOM kills are
recorded (:class:`~tests.cluster.limits.NodeUsage`: ``Node.run(...).usage``, :attr:`Cluster.usage`).

What stands in for the internet: the offline corpora archive cache (``$TIDAL_ARCHIVE_CACHE``,
default ``~/.cache/tidal/archives``), bind-mounted read-only into every node.

Shared services, each in its own process group, stopped by killing that group:

* the bucket: ``python -m moto.server`` on the gateway, bucket ``tidal``;
* PostgreSQL on 127.0.0.1:5432 (``.ci/services.sh start`` if nothing listens there), with a
  fresh database per cluster, dropped at :meth:`Cluster.stop`; nodes reach it, and Redis on 6379,
  through a relay on the gateway (tests/cluster/relay.py);
* ``mlflow server`` on the gateway: that database as its backend store, artifacts proxied into
  ``s3://tidal/mlflow-artifacts`` (only the server talks to the bucket for artifacts).

Usage::

    with Cluster.start(tmp_path) as cluster:
        out = cluster.node("node-a").run([sys.executable, "-m", "tidal.cli", "plan", recipe])
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self

from tests.cluster.image import Image, image_of
from tests.cluster.limits import Cgroups, NodeLimits, NodeUsage
from tests.cluster.network import ClusterNetwork, NetworkError, network_unavailable
from tests.cluster.node import (
    Node,
    NodeError,
    NodeResult,
    NodeTimeout,
    _die_with_parent,
    _stop_group,
    bootstrap_script,
    namespaces_unavailable,
    stop_node,
)
from tests.storage.servers import MotoServer, free_port

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tidal"
STORAGE_ROOT = f"s3://{BUCKET}/root"
MLFLOW_ARTIFACTS = f"s3://{BUCKET}/mlflow-artifacts"
STORAGE_CACHE = "/var/cache/tidal-node"  # inside the node's private /var/cache tmpfs
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class ClusterUnavailable(RuntimeError):
    """This machine cannot host the cluster (no namespaces, not root, no PostgreSQL); says why."""


class Cluster:
    """The shared services and the settings every node gets. Build it with :meth:`start`.

    Attributes:
        workdir: the cluster's own folder (logs, hosts file); removed by :meth:`stop`.
        env: what every node's environment is, exactly (endpoints, credentials, storage root,
            MLflow URI, PATH, PYTHONPATH=repository, ...); :meth:`Node.run` adds its ``env``.
        s3_endpoint: the moto S3 server's URL (http://<gateway>:port), reachable from nodes and the test process.
        mlflow_uri: the MLflow server's URL (http://<gateway>:port), as reachable.
        service_host: the gateway address (:attr:`ClusterNetwork.gateway`) where nodes reach the shared
            services: the bucket, MLflow, PostgreSQL (:data:`PG_PORT`) and Redis (6379), the last two relayed.
        network: the cluster's bridge and node namespaces (tests/cluster/network.py).
        image: what every node runs (tests/cluster/image.py), bound read-only over the checkout's path.
        database: the PostgreSQL database of this cluster (MLflow's backend store).
        read_only: whether a node's disk is read-only outside its private tmpfs dirs.
        id: the cluster's own id (its database's and its parent cgroup's name, ``tidal-<id>``).
        limits_skipped: controller ('memory', 'cpu') -> why that limit is not enforced on this machine
            (empty where every limit is; never set under ``CI=true``: the cluster does not start).
    """

    def __init__(self, workdir: Path, *, read_only: bool = True):
        self.workdir = Path(workdir)
        self.read_only = read_only
        self.id = uuid.uuid4().hex[:10]
        self.database = f"tidal_cluster_{self.id}"
        self.hosts_file = self.workdir / "hosts"
        self.s3_endpoint = ""
        self.mlflow_uri = ""
        self.service_host = ""
        self.network: ClusterNetwork | None = None
        self.image: Image | None = None
        self._relays: list[subprocess.Popen] = []
        self._relayed: set[int] = set()  # ports of 127.0.0.1 relayed to the gateway
        self.env: dict[str, str] = {}
        self._names: list[str] = []
        self._addresses: dict[str, str] = {}
        self._aliases: dict[str, list[str]] = {}
        self._dns_names: dict[str, str] = {}  # cluster-wide name that is not a node -> its node (add_dns_name)
        self._limits: dict[str, NodeLimits] = {}  # node -> its limits, where not the defaults
        self._cgroups: Cgroups | None = None
        self.limits_skipped: dict[str, str] = {}
        self._lock = threading.Lock()
        self._moto: MotoServer | None = None
        self._mlflow: subprocess.Popen | None = None
        self._db_created = False
        self._services_state: Path | None = None  # set when this cluster ran .ci/services.sh start
        self._shared: list[Path] = []  # folders every node sees read-only (share_read_only)

    @classmethod
    def start(cls, workdir: Path, *, nodes: Iterable[str] = (), read_only: bool = True,
              timeout_s: float = 300) -> Cluster:
        """Start the bucket, a fresh PostgreSQL database and the MLflow server; return the cluster.

        Args:
            workdir: an empty or missing folder for the cluster's files (removed at stop).
            nodes: node names to put in the hosts file now (:meth:`node` adds any later).
            read_only: make each node's disk read-only outside its private tmpfs dirs (the
                repository checkout included), so no node can use the disk as a channel.
            timeout_s: seconds each service may take to answer.

        Raises:
            ClusterUnavailable: the cluster's network cannot be built (no root, no ``ip``, an ``ip`` command
                failed); PostgreSQL is unreachable on 127.0.0.1:5432 even after
                ``.ci/services.sh start``; or, under ``CI=true``, a node limit's cgroup controller is
                unavailable (elsewhere that limit is skipped with a warning: :attr:`limits_skipped`).
            RuntimeError: a service did not come up in time (the message has its log's tail).
        """
        cluster = cls(workdir, read_only=read_only)
        cluster.workdir.mkdir(parents=True, exist_ok=True)
        cluster.hosts_file.write_text("")
        try:
            cluster.image = image_of(REPO)
            cluster._start_network()
            for name in nodes:
                cluster._add_name(name)
            cluster._start_cgroups()
            cluster._start_bucket(timeout_s)
            cluster._create_database()
            cluster._start_relay([PG_PORT, 6379], timeout_s)
            cluster._start_mlflow(timeout_s)
            cluster.env = cluster._node_env()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def node(self, name: str, *, aliases: Sequence[str] = (), memory_mb: int | None = None,
             cpus: float | None = None, tmpfs_mb: int | None = None, disk_mb: int | None = None) -> Node:
        """The node called ``name`` (a hostname: lowercase letters, digits, '-'); it joins the hosts file.
        ``aliases`` are hostnames that resolve to the node's own :attr:`Node.address` on that node alone
        (``beam-worker-pool``: the SDK worker pool beside a TaskManager).

        Its limits (:class:`~tests.cluster.limits.NodeLimits`; each left out or None is the default there,
        the training pod's own limits), for every boot from now on, until the next call for ``name``:
        ``memory_mb``, its memory cgroup's limit (the OOM killer kills past it, exit 137; its tmpfs pages
        count); ``cpus``, its CPU quota in cores; ``tmpfs_mb``, the size of each of its private disks
        (/tmp, /var/cache, ~/.cache ...), for a node whose disk is smaller than its data. ``disk_mb`` is
        ``tmpfs_mb``'s older name.

        Raises:
            ValueError: ``name`` or an alias is not a valid hostname; a limit is out of range; ``disk_mb``
                and ``tmpfs_mb`` disagree.
        """
        for alias in aliases:
            if not NODE_NAME.match(alias):
                raise ValueError(f"alias {alias!r} is not a hostname")
        if disk_mb is not None and tmpfs_mb is not None and int(disk_mb) != int(tmpfs_mb):
            raise ValueError(f"disk_mb={disk_mb} and tmpfs_mb={tmpfs_mb}: disk_mb is tmpfs_mb's older name, give one")
        tmpfs_mb = tmpfs_mb if tmpfs_mb is not None else disk_mb
        given = {k: v for k, v in (("memory_mb", memory_mb), ("cpus", cpus),
                                   ("tmpfs_mb", None if tmpfs_mb is None else int(tmpfs_mb))) if v is not None}
        limits = NodeLimits(**given)
        self._add_name(name, aliases)
        with self._lock:
            self._limits[name] = limits
        return Node(self, name)

    def limits_of(self, name: str) -> NodeLimits:
        """The limits node ``name`` boots with (the defaults for a name :meth:`node` has not set)."""
        with self._lock:
            return self._limits.get(name) or NodeLimits()

    @property
    def usage(self) -> list[NodeUsage]:
        """Every finished node boot's :class:`~tests.cluster.limits.NodeUsage` (peak memory, OOM kills), in
        the order they finished (empty where no cgroup controller is available)."""
        return list(self._cgroups.usage) if self._cgroups else []

    def share_read_only(self, folder: Path) -> None:
        """Let every node booted from now on see ``folder`` read-only at the same path, also where it lies
        under a node's private /tmp or /var/tmp: what an image carries (a DAG bundle, the recipes)."""
        with self._lock:
            self._shared.append(Path(folder).resolve())

    @property
    def backend_store_uri(self) -> str:
        """The SQLAlchemy URI of this cluster's PostgreSQL database (MLflow's backend store)."""
        return f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.database}"

    def s3(self):
        """A boto3 S3 client for the cluster's bucket server (``BUCKET`` is the bucket's name)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_endpoint, region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def stop(self) -> None:
        """Stop MLflow and moto (SIGTERM to each process group, SIGKILL after 10 s), drop the database,
        stop PostgreSQL if this cluster started it, kill what is left of any node and remove the nodes'
        cgroups and their parent, remove ``workdir``. Safe to call twice."""
        if self._cgroups is not None:
            self._cgroups.remove()
        if self._mlflow is not None:
            _stop_group(self._mlflow)
            self._mlflow = None
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self._db_created:
            conn = self.pg_admin()
            try:
                with conn.cursor() as cur:
                    cur.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            finally:
                conn.close()
            self._db_created = False
        for relay in self._relays:
            _stop_group(relay)
        self._relays.clear()
        self._relayed.clear()
        if self._services_state is not None:
            subprocess.run(["bash", str(REPO / ".ci" / "services.sh"), "stop"], check=False,
                           env={**os.environ, "TIDAL_SERVICES_STATE": str(self._services_state)})
            self._services_state = None
        if self.network is not None:
            self.network.remove()
            self.network = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- nodes -------------------------------------------------------------------------------

    def _start_cgroups(self) -> None:
        """Create the cluster's parent cgroups; a controller that is unavailable is skipped with a warning,
        or, under ``CI=true``, is ClusterUnavailable."""
        self._cgroups = Cgroups(self.id)
        self.limits_skipped = dict(self._cgroups.skipped)
        if not self.limits_skipped:
            return
        reasons = "; ".join(f"{c} limit: {why}" for c, why in self.limits_skipped.items())
        if os.environ.get("CI") == "true":
            raise ClusterUnavailable(f"node limits cannot be enforced ({reasons})")
        warnings.warn(f"test cluster: node limits skipped ({reasons})", stacklevel=3)

    def add_dns_name(self, name: str, node: str) -> None:
        """Let ``name`` (e.g. a JobSet pod's ``{hostname}.{subdomain}``) resolve to node ``node``'s address on
        every node, as cluster DNS resolves a pod to its IP; ``node`` joins the cluster if it is new.

        Raises:
            ValueError: a label of ``name`` is not a hostname, or ``node`` is not a valid node name.
        """
        if not all(NODE_NAME.match(label) for label in name.split(".")):
            raise ValueError(f"{name!r} is not a DNS name")
        self._add_name(node)
        with self._lock:
            self._dns_names[name] = node
            self._write_hosts()

    def _add_name(self, name: str, aliases: Sequence[str] = ()) -> None:
        if not NODE_NAME.match(name) or name == "localhost":
            raise ValueError(f"node name {name!r} is not a hostname: use lowercase letters, digits and '-' "
                             "(at most 63, not starting or ending with '-'), e.g. 'node-a'")
        with self._lock:
            if name not in self._names:
                self._names.append(name)
                try:
                    self._addresses[name] = self.network.add_node(name, len(self._names))
                except NetworkError as err:
                    raise ClusterUnavailable(f"node {name}: {err}") from None
            self._aliases[name] = sorted({*self._aliases.get(name, ()), *aliases})
            self._write_hosts()

    def _write_hosts(self) -> None:
        """Rewrite every hosts file (call with the lock held)."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 *(f"{self._addresses[n]} {n}" for n in self._names),
                 *(f"{self._addresses[node]} {name}" for name, node in sorted(self._dns_names.items()))]
        # Rewrite in place (same inode): nodes already running have these files bound over /etc/hosts.
        files = [(None, self.hosts_file), *((n, self._hosts_of(n)) for n, a in self._aliases.items() if a)]
        for node, path in files:
            own = [f"{self._addresses[node]} {' '.join(self._aliases[node])}"] if node else []
            path.touch()
            with open(path, "r+") as hosts:
                hosts.truncate(0)
                hosts.write("\n".join([*lines, *own]) + "\n")

    def _hosts_of(self, name: str) -> Path:
        """The hosts file node ``name`` sees: its own when it has aliases, else the cluster's."""
        return self.workdir / f"hosts.{name}" if self._aliases.get(name) else self.hosts_file

    def bootstrap(self, name: str, env: Mapping[str, str], limits: NodeLimits | None = None) -> str:
        """The bash script node ``name`` runs as its PID 1 around ``"$@"`` (its command) in environment ``env``
        with ``limits`` (default: the node's, :meth:`limits_of`): :func:`tests.cluster.node.bootstrap_script`
        with this cluster's hosts file, shared folders, image and storage cache."""
        keep = [(p, p) for p in self._shared]
        if self.image is not None:
            keep.append((self.image.path, REPO))
        return bootstrap_script(name, env, limits or self.limits_of(name), hosts_file=self._hosts_of(name),
                                keep=keep, read_only=self.read_only, storage_cache=STORAGE_CACHE)

    def image_env(self) -> dict[str, str]:
        """What the image sets for every container (the ``ENV`` of images/train-*.Dockerfile, for this CPU-only
        image): PATH with the venv first, ``PYTHONUNBUFFERED``, ``TIDAL_GIT_SHA``; plus HOME, LANG and TMPDIR,
        which a container runtime and the base image give, and ``JAX_PLATFORMS=cpu`` (no accelerator here)."""
        return {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(Path.home()),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # the image is read-only
            "JAX_PLATFORMS": "cpu",
            "TIDAL_GIT_SHA": self.image.git_sha if self.image else "unknown",
        }

    def _node_env(self) -> dict[str, str]:
        home = Path.home()
        archives = os.environ.get("TIDAL_ARCHIVE_CACHE") or str(home / ".cache" / "tidal" / "archives")
        return {
            "HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
            "RAYON_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "JAX_PLATFORMS": "cpu",
            "DO_NOT_TRACK": "true",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            **CREDENTIALS,
            "AWS_EC2_METADATA_DISABLED": "true",
            "TIDAL_S3_ENDPOINT_URL": self.s3_endpoint,
            "TIDAL_STORAGE_ROOT": STORAGE_ROOT,
            "TIDAL_STORAGE_CACHE": STORAGE_CACHE,
            "TIDAL_ARCHIVE_CACHE": archives,
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "TIDAL_GIT_SHA": self.image.git_sha if self.image else "unknown",  # the image has no .git
            # a trainer killed with its node holds its step's training lease until this expires: its retry
            # waits that long (tidal/train/fence.py; 60 s by default, shorter than GKE's rescheduling)
            "TIDAL_TRAIN_LEASE_TTL_S": "10",
        }

    # --- services ----------------------------------------------------------------------------

    def _start_network(self) -> None:
        why = network_unavailable()
        if why:
            raise ClusterUnavailable(why)
        try:
            self.network = ClusterNetwork.create()
        except NetworkError as err:
            raise ClusterUnavailable(str(err)) from None
        self.service_host = self.network.gateway

    def reach_loopback(self, port: int, timeout_s: float = 60) -> str:
        """Let nodes reach a server of the test process's machine that listens on 127.0.0.1:``port`` only (the
        Kubernetes API server of tests/cluster/kube.py): relay ``<gateway>:port`` to it for the cluster's life.
        Returns the gateway address, where nodes dial it. RuntimeError: the relay did not start."""
        with self._lock:
            new = port not in self._relayed
            self._relayed.add(port)
        if new:
            self._start_relay([port], timeout_s)
        return self.service_host

    def _start_relay(self, ports: list[int], timeout_s: float) -> None:
        """Relay ``ports`` of 127.0.0.1 (PostgreSQL and Redis listen there only) to the gateway."""
        log_path = self.workdir / f"relay-{'-'.join(map(str, ports))}.log"
        with open(log_path, "wb") as log:
            relay = subprocess.Popen(_die_with_parent(
                [sys.executable, "-m", "tests.cluster.relay", self.service_host, PG_HOST, *map(str, ports)]),
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._relays.append(relay)
        self._relayed.update(ports)
        deadline = time.monotonic() + timeout_s
        while b"relay ready" not in log_path.read_bytes():
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"relay of ports {ports} did not start (exit {relay.poll()}): "
                                   f"{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def _start_bucket(self, timeout_s: float) -> None:
        self._moto = MotoServer(host=self.service_host)
        self._moto.start(timeout_s)
        self.s3_endpoint = self._moto.endpoint
        self.s3().create_bucket(Bucket=BUCKET)

    def pg_admin(self):
        """An autocommit connection to PostgreSQL's ``postgres`` database (create / drop databases)."""
        import psycopg2

        conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=5)
        conn.autocommit = True
        return conn

    def _create_database(self) -> None:
        import psycopg2

        try:
            conn = self.pg_admin()
        except psycopg2.OperationalError:
            self._services_state = self.workdir / "services-state"
            state_env = {**os.environ, "TIDAL_SERVICES_STATE": str(self._services_state)}
            started = subprocess.run(["bash", str(REPO / ".ci" / "services.sh"), "start"], check=False,
                                     capture_output=True, text=True, env=state_env)
            try:
                conn = self.pg_admin()
            except psycopg2.OperationalError as err:
                raise ClusterUnavailable(
                    f"PostgreSQL is unreachable on {PG_HOST}:{PG_PORT} as {PG_USER!r} ({str(err).strip()}), also "
                    f"after `.ci/services.sh start` (exit {started.returncode}): {started.stderr[-2000:]}") from None
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()
        self._db_created = True

    def _start_mlflow(self, timeout_s: float) -> None:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
        env |= {**CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint, "MLFLOW_DISABLE_TELEMETRY": "true",
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job-runner process: nothing here uses it
        log_path = self.workdir / "mlflow-server.log"
        with open(log_path, "wb") as log:
            self._mlflow = subprocess.Popen(_die_with_parent(
                [sys.executable, "-m", "mlflow", "server", "--host", self.service_host, "--port", str(port),
                 "--workers", "1", "--backend-store-uri", self.backend_store_uri,
                 "--serve-artifacts", "--artifacts-destination", MLFLOW_ARTIFACTS]),
                env=env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.mlflow_uri = f"http://{self.service_host}:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.mlflow_uri}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self._mlflow.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server on {self.mlflow_uri} did not answer /health within {timeout_s} s "
                                   f"(exit {self._mlflow.poll()}):\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)


__all__ = ["BUCKET", "Cluster", "ClusterUnavailable", "Node", "NodeError", "NodeLimits", "NodeResult", "NodeTimeout",
           "NodeUsage", "namespaces_unavailable", "stop_node"]
