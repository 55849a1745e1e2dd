"""A share-nothing test cluster on one machine: namespaced "nodes" that share only the bucket,
PostgreSQL and the MLflow server.

Invariant: a node can hand another node (or the test process) nothing except through the shared
services. Each :meth:`Node.run` is a fresh process tree in its own mount, UTS and PID namespaces
(``unshare``): its own hostname, a private tmpfs over every place a program writes scratch
(``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/var/cache`` with the storage cache, ``~/.cache``,
``~/.config``), and the rest of the disk read-only, the repository checkout included. When the
command ends the namespace's init exits, so every process the node started dies and its tmpfs
mounts go with it. The network namespace is shared: loopback is how nodes reach the services,
as pods reach a bucket, a database and a tracking server by address.

What stands in for the internet: the offline corpora archive cache (``$TIDAL_ARCHIVE_CACHE``,
default ``~/.cache/tidal/archives``), bind-mounted read-only into every node.

Shared services, each in its own process group, stopped by killing that group:

* the bucket: ``python -m moto.server`` on 127.0.0.1, bucket ``tidal``;
* PostgreSQL on 127.0.0.1:5432 (``.ci/services.sh start`` if nothing listens there), with a
  fresh database per cluster, dropped at :meth:`Cluster.stop`;
* ``mlflow server`` on 127.0.0.1: that database as its backend store, artifacts proxied into
  ``s3://tidal/mlflow-artifacts`` (only the server talks to the bucket for artifacts).

Usage::

    with Cluster.start(tmp_path) as cluster:
        out = cluster.node("node-a").run([sys.executable, "-m", "tidal.cli", "plan", recipe])
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self

from tests.cluster.addresses import node_address
from tests.storage.servers import MotoServer, free_port

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tidal"
STORAGE_ROOT = f"s3://{BUCKET}/root"
MLFLOW_ARTIFACTS = f"s3://{BUCKET}/mlflow-artifacts"
STORAGE_CACHE = "/var/cache/tidal-node"  # inside the node's private /var/cache tmpfs
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
UNSHARE = ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TAIL_CHARS = 4000


class ClusterUnavailable(RuntimeError):
    """This machine cannot host the cluster (no namespaces, not root, no PostgreSQL); says why."""


class NodeError(subprocess.CalledProcessError):
    """A node's command exited non-zero (``run(check=True)``); the message carries its output's tail."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{_tail(self.stdout, self.stderr)}"


class NodeTimeout(subprocess.TimeoutExpired):
    """A node's command ran past its timeout and the node was killed; the message carries its output's tail."""

    def __str__(self) -> str:
        return f"{super().__str__()} (the node was killed)\n{_tail(self.stdout, self.stderr)}"


def _tail(stdout: str | None, stderr: str | None) -> str:
    return (f"--- stdout (tail) ---\n{(stdout or '')[-TAIL_CHARS:]}\n"
            f"--- stderr (tail) ---\n{(stderr or '')[-TAIL_CHARS:]}")


def namespaces_unavailable() -> str | None:
    """Why this machine cannot create a node's namespaces, or None when it can (tries ``unshare`` once)."""
    if os.geteuid() != 0:
        return "the test cluster needs root (mount, UTS and PID namespaces, tmpfs mounts)"
    if shutil.which("unshare") is None:
        return "the test cluster needs util-linux's unshare, which is not on PATH"
    try:
        probe = subprocess.run([*UNSHARE, "true"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare failed: {err}"
    if probe.returncode != 0:
        return f"unshare --mount --uts --pid --fork failed ({probe.returncode}): {probe.stderr.strip()}"
    return None


def _die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` under ``setpriv --pdeathsig KILL`` where there is setpriv: it dies if the test process does."""
    return ["setpriv", "--pdeathsig", "KILL", *argv] if shutil.which("setpriv") else argv


def stop_node(proc: subprocess.Popen, *, kill: bool = False) -> None:
    """Stop a node :meth:`Node.start` booted: SIGTERM with a 10 s grace, or at once SIGKILL of its
    whole process tree (``kill=True``: the machine is lost)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return
    _stop_group(proc)


def _stop_group(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL after ``grace_s`` seconds, then reap it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.poll()


class Node:
    """One named machine of the cluster; every :meth:`run` or :meth:`start` is a fresh boot (new
    namespaces, empty tmpfs).

    Attributes:
        address: the node's own loopback address (:func:`node_address`), which the names in ``aliases``
            resolve to on this node only, as a pod's sidecar is ``localhost`` to it alone (the network
            namespace is shared, so a per-node service binds this address, not a port of its own).
    """

    def __init__(self, cluster: Cluster, name: str):
        self.cluster = cluster
        self.name = name
        self.address = cluster._addresses[name]

    def _boot(self, command: Sequence[str], env: Mapping[str, str] | None) -> tuple[dict[str, str], list[str]]:
        """The node's environment (:attr:`Cluster.env` updated with ``env``) and the argv that boots it
        around ``command`` (new namespaces, the bootstrap script as PID 1)."""
        node_env = {**self.cluster.env, **(env or {})}
        return node_env, [*UNSHARE, "bash", "-c", self.cluster.bootstrap(self.name, node_env), f"node:{self.name}",
                          *command]

    def start(self, command: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Boot the node and run ``command`` in the background (a long-running service: a Flink
        TaskManager, a worker pool), stdout and stderr to ``log``. Stop it by its process group
        (:func:`stop_node`): the node's namespace init dies and takes every process of the node along,
        as losing the machine would.
        """
        node_env, argv = self._boot(command, env)
        with open(log, "ab") as out:
            return subprocess.Popen(_die_with_parent(argv), env=node_env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
            check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Boot the node, run ``command`` in a fresh directory under its /tmp, and tear the node down.

        The command gets :attr:`Cluster.env` updated with ``env``, nothing else of the test process's
        environment. Output is captured as text. Safe to call from several threads at once (nodes run
        concurrently).

        Args:
            command: argv; the first word is looked up on the node's PATH.
            env: extra or overriding variables for this run.
            timeout: seconds before the node's whole process group is SIGKILLed.
            check: raise :class:`NodeError` on a non-zero exit.
            input: text written to the command's stdin (default: stdin is /dev/null).

        Raises:
            NodeTimeout: the command ran longer than ``timeout`` seconds (the node was killed).
            NodeError: ``check`` and the command exited non-zero (125: the node's bootstrap failed).
        """
        node_env, argv = self._boot(command, env)
        proc = subprocess.Popen(_die_with_parent(argv), env=node_env, text=True, errors="replace",
                                stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise NodeTimeout(list(command), timeout, stdout, stderr) from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if check and proc.returncode != 0:
            raise NodeError(proc.returncode, list(command), stdout, stderr)
        return subprocess.CompletedProcess(list(command), proc.returncode, stdout, stderr)

    def __repr__(self) -> str:
        return f"Node({self.name!r})"


class Cluster:
    """The shared services and the settings every node gets. Build it with :meth:`start`.

    Attributes:
        workdir: the cluster's own folder (logs, hosts file); removed by :meth:`stop`.
        env: what every node's environment is, exactly (endpoints, credentials, storage root,
            MLflow URI, PATH, PYTHONPATH=repository, ...); :meth:`Node.run` adds its ``env``.
        s3_endpoint: the moto S3 server's URL (http://127.0.0.1:port).
        mlflow_uri: the MLflow server's URL (http://127.0.0.1:port), also reachable from the test process.
        database: the PostgreSQL database of this cluster (MLflow's backend store).
        read_only: whether a node's disk is read-only outside its private tmpfs dirs.
    """

    def __init__(self, workdir: Path, *, read_only: bool = True):
        self.workdir = Path(workdir)
        self.read_only = read_only
        self.database = f"tidal_cluster_{uuid.uuid4().hex[:10]}"
        self.hosts_file = self.workdir / "hosts"
        self.s3_endpoint = ""
        self.mlflow_uri = ""
        self.env: dict[str, str] = {}
        self._names: list[str] = []
        self._addresses: dict[str, str] = {}
        self._aliases: dict[str, list[str]] = {}
        self._dns_names: list[str] = []  # cluster-wide names that are not nodes (add_dns_name)
        self._disk_mb: dict[str, int] = {}  # node -> size of each of its private tmpfs mounts (MiB)
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
            ClusterUnavailable: PostgreSQL is unreachable on 127.0.0.1:5432 even after
                ``.ci/services.sh start``.
            RuntimeError: a service did not come up in time (the message has its log's tail).
        """
        cluster = cls(workdir, read_only=read_only)
        cluster.workdir.mkdir(parents=True, exist_ok=True)
        cluster.hosts_file.write_text("")
        try:
            for name in nodes:
                cluster._add_name(name)
            cluster._start_bucket(timeout_s)
            cluster._create_database()
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

    def node(self, name: str, *, aliases: Sequence[str] = (), disk_mb: int | None = None) -> Node:
        """The node called ``name`` (a hostname: lowercase letters, digits, '-'); it joins the hosts file.
        ``aliases`` are hostnames that resolve to the node's own :attr:`Node.address` on that node alone
        (``beam-worker-pool``: the SDK worker pool beside a TaskManager). ``disk_mb``: the size of each
        of its private disks (/tmp, /var/cache, ~/.cache ...; default: half the memory, tmpfs's), for a
        node whose disk is smaller than its data.

        Raises:
            ValueError: ``name`` or an alias is not a valid hostname.
        """
        for alias in aliases:
            if not NODE_NAME.match(alias):
                raise ValueError(f"alias {alias!r} is not a hostname")
        self._add_name(name, aliases)
        with self._lock:
            if disk_mb is None:
                self._disk_mb.pop(name, None)
            else:
                self._disk_mb[name] = int(disk_mb)
        return Node(self, name)

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
        stop PostgreSQL if this cluster started it, remove ``workdir``. Safe to call twice."""
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
        if self._services_state is not None:
            subprocess.run(["bash", str(REPO / ".ci" / "services.sh"), "stop"], check=False,
                           env={**os.environ, "TIDAL_SERVICES_STATE": str(self._services_state)})
            self._services_state = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- nodes -------------------------------------------------------------------------------

    def add_dns_name(self, name: str) -> None:
        """Let ``name`` (e.g. a JobSet pod's ``{hostname}.{subdomain}``) resolve to 127.0.0.1 (shared loopback)
        on every node, as cluster DNS resolves a pod. ValueError: a label of ``name`` is not a hostname."""
        if not all(NODE_NAME.match(label) for label in name.split(".")):
            raise ValueError(f"{name!r} is not a DNS name")
        with self._lock:
            self._dns_names = sorted({*self._dns_names, name})
            self._write_hosts()

    def _add_name(self, name: str, aliases: Sequence[str] = ()) -> None:
        if not NODE_NAME.match(name) or name == "localhost":
            raise ValueError(f"node name {name!r} is not a hostname: use lowercase letters, digits and '-' "
                             "(at most 63, not starting or ending with '-'), e.g. 'node-a'")
        with self._lock:
            if name not in self._names:
                self._names.append(name)
                self._addresses[name] = node_address(len(self._names))
            self._aliases[name] = sorted({*self._aliases.get(name, ()), *aliases})
            self._write_hosts()

    def _write_hosts(self) -> None:
        """Rewrite every hosts file (call with the lock held)."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 *(f"127.0.0.1 {n}" for n in [*self._names, *self._dns_names])]
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

    def bootstrap(self, name: str, env: Mapping[str, str]) -> str:
        """The bash script node ``name`` runs as its PID 1 around ``"$@"`` (its command) in environment ``env``:
        it exits with the command's status, or 125 if the node's own set-up failed."""
        home = Path(env.get("HOME") or Path.home())
        archives = Path(env.get("TIDAL_ARCHIVE_CACHE") or home / ".cache" / "tidal" / "archives")
        private = ["/tmp", "/var/tmp", "/dev/shm", "/var/cache", str(home / ".cache"), str(home / ".config")]
        q = shlex.quote
        lines = [
            "set -eEuo pipefail",
            f"trap 'echo \"cluster node {name}: bootstrap failed: $BASH_COMMAND\" >&2; exit 125' ERR",
            f"hostname {q(name)}",
            f"mount --bind {q(str(self._hosts_of(name)))} /etc/hosts",
            "mount -o remount,bind,ro /etc/hosts",
            *(f"mkdir -p {q(d)}" for d in private),  # before / may turn read-only
        ]
        # Kept visible, read-only, through the private tmpfs mounts: the corpora archive cache (under
        # ~/.cache) and the checkout with its .venv when it lies under a private directory (a CI clone
        # in /tmp or /var/tmp). A handle is taken first: the tmpfs hides the path.
        tools = Path(env.get("TIDAL_TOOLS_CACHE") or home / ".cache" / "tidal" / "tools")  # Flink, job server
        keep = [p for p in (archives, tools, *self._shared) if p.is_dir()]
        if any(REPO == Path(d) or Path(d) in REPO.parents for d in private):
            keep.append(REPO)
        for fd, path in enumerate(keep, start=3):
            lines.append(f"exec {fd}< {q(str(path))}")
        if self.read_only:
            lines.append("mount -o remount,bind,ro /")
        size = f",size={self._disk_mb[name]}m" if name in self._disk_mb else ""
        mode = {d: "1777" if d in ("/tmp", "/var/tmp", "/dev/shm") else "755" for d in private}  # re-mkdir: HOME=/tmp
        lines += [f"mkdir -p {q(d)} && mount -t tmpfs -o mode={mode[d]}{size} tmpfs {q(d)}" for d in private]
        for fd, path in enumerate(keep, start=3):
            lines += [f"mkdir -p {q(str(path))}",
                      f"mount --no-canonicalize --bind /proc/self/fd/{fd} {q(str(path))}",
                      f"mount -o remount,bind,ro {q(str(path))}",
                      f"exec {fd}<&-"]
        lines += [f"mkdir -p {q(STORAGE_CACHE)} /tmp/work",
                  "cd /tmp/work",
                  "trap - ERR",
                  "set +eEu +o pipefail",
                  '"$@"',
                  "exit $?"]
        return "\n".join(lines) + "\n"

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
        }

    # --- services ----------------------------------------------------------------------------

    def _start_bucket(self, timeout_s: float) -> None:
        self._moto = MotoServer()
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
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                 "--workers", "1", "--backend-store-uri", self.backend_store_uri,
                 "--serve-artifacts", "--artifacts-destination", MLFLOW_ARTIFACTS]),
                env=env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.mlflow_uri = f"http://127.0.0.1:{port}"
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


__all__ = ["BUCKET", "Cluster", "ClusterUnavailable", "Node", "NodeError", "NodeTimeout", "namespaces_unavailable",
           "stop_node"]
