"""Airflow in production shape on the test cluster: scheduler, dag-processor, api-server and triggerer
on PostgreSQL, CeleryExecutor on Redis, and Celery workers each on a node of its own.

Shared by tests/cluster/test_airflow_celery.py, bench/airflow_cluster.py and ``make cluster-demo``.

What each part is, and what it shares:

* The control plane (scheduler, dag-processor, api-server, triggerer) runs on this machine, each
  ``airflow`` component in its own process group, on a fresh PostgreSQL database of its own. It
  runs no task.
* Each worker is ``airflow celery worker`` booted in a node (tests/cluster/harness.py): private
  /tmp, caches and storage cache, its own hostname. It reaches the broker (Redis), the metadata
  database (Celery's result backend), the execution API, the bucket and the MLflow server by
  address, and sees the DAG bundle (``dags/``, ``operators/``, the recipes) read-only, as an image
  carries it. Losing the node (:meth:`AirflowCluster.kill_worker`) kills every task process on it.
* Retries are Airflow's own (``[core] default_task_retries`` = 1, 5 s apart); a task whose worker
  vanished is failed by the scheduler after ``[scheduler] task_instance_heartbeat_timeout`` (30 s
  here, 300 s by default) and retried on any worker.
* Task logs stay on the worker's node (``--skip-serve-logs``: two log servers cannot share a port on
  one network namespace); each worker's own output goes to ``<workdir>/<worker>.log``.
* Each cluster has its own Celery queue, so that two clusters on one Redis never take each other's tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from tests.cluster.harness import PG_PORT, PG_USER, REPO, Cluster, stop_node
from tests.ops.airflow_api import AirflowApi
from tests.storage.servers import free_port

VENV_BIN = Path(sys.executable).parent
REDIS_PORT = 6379  # .ci/services.sh; nodes reach it through the cluster's relay on the gateway
CONTROL_PLANE = ("scheduler", "dag-processor", "api-server", "triggerer")
HEARTBEAT_TIMEOUT_S = 30
STARTUP_TIMEOUT_S = 300


def seconds_between(record: Mapping[str, object]) -> float:
    """``end_date - start_date`` of a DAG run or task instance from the REST API, in seconds (0 if unset)."""
    from datetime import datetime

    start, end = record.get("start_date"), record.get("end_date")
    if not (start and end):
        return 0.0
    return (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()


class AirflowCluster(AirflowApi):
    """A started production-shape Airflow (:meth:`start`); a REST client of its API server.

    Attributes:
        cluster: the test cluster whose nodes host the workers and whose bucket and MLflow the tasks use.
        workdir: logs, AIRFLOW_HOME of the control plane, the DAG bundle's recipes.
        recipes: the recipes folder of the DAG bundle (``$TIDAL_RECIPES_DIR``), visible to every node.
        env: the Airflow settings every component and worker gets (on top of the cluster's).
        workers: worker name -> its node's process (absent: not running).
    """

    def __init__(self, cluster: Cluster, workdir: Path, recipes: Mapping[str, str],
                 env: Mapping[str, str] | None = None):
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        super().__init__("", secrets.token_hex(8), self.workdir / "api-server.log")
        self.recipes = self.workdir / "bundle" / "recipes"
        self.recipes.mkdir(parents=True)
        for name, text in recipes.items():
            (self.recipes / f"{name}.yaml").write_text(text)
        cluster.share_read_only(self.recipes.parent)
        self.database = f"tidal_airflow_{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.url = f"http://{cluster.service_host}:{self.port}"  # on the gateway: the workers' nodes reach it
        self.queue = f"tidal-{uuid.uuid4().hex[:8]}"
        self.env = {**self._airflow_env(), **(env or {})}
        self.workers: dict[str, subprocess.Popen] = {}
        self._control: dict[str, subprocess.Popen] = {}

    @classmethod
    def start(cls, cluster: Cluster, workdir: Path, recipes: Mapping[str, str], *,
              workers: Sequence[str] = ("worker-a", "worker-b"), concurrency: int = 2,
              env: Mapping[str, str] | None = None) -> Self:
        """Create the metadata database, migrate it, start the control plane and ``workers`` (one node
        each, ``concurrency`` task slots each) and log in; ``env``: more settings for every component and
        worker (e.g. an ``AIRFLOW_CONN_*``). Raises RuntimeError (with the log's tail) if a component does
        not come up within STARTUP_TIMEOUT_S."""
        self = cls(cluster, workdir, recipes, env)
        try:
            self._create_database()
            home = Path(self.env["AIRFLOW_HOME"])
            home.mkdir()
            (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": self.password}))
            migrate = self._airflow(["db", "migrate"], timeout=600)
            if migrate.returncode != 0:
                raise RuntimeError(f"airflow db migrate failed:\n{(migrate.stdout + migrate.stderr)[-4000:]}")
            for component in CONTROL_PLANE:
                self._start_component(component)
            for name in workers:
                self.start_worker(name, concurrency=concurrency)
            self._wait_healthy()
            self.login()
        except BaseException:
            self.stop()
            raise
        return self

    # --- components --------------------------------------------------------------------------

    def _airflow_env(self) -> dict[str, str]:
        host = self.cluster.service_host  # the gateway: the same address from the control plane and the nodes
        db = f"{PG_USER}@{host}:{PG_PORT}/{self.database}"
        return {
            "AIRFLOW_HOME": str(self.workdir / "airflow"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{host}:{REDIS_PORT}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{db}",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "1",
            "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "5",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": host,
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "120",  # 5 s by default: too short on a loaded CI machine
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20",
            # no recipe changes while a test Airflow runs: parsed when found, not every 30 s (each parse builds
            # every recipe's DAGs, 7-16 s under load, 44 times in one run of the Celery tests)
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "TIDAL_RECIPES_DIR": str(self.recipes),
        }

    def _control_env(self) -> dict[str, str]:
        """The control plane's environment: the cluster's settings, a storage cache of its own on this disk."""
        env = {**self.cluster.env, **self.env, "TIDAL_STORAGE_CACHE": str(self.workdir / "storage-cache")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
        return env

    def _airflow(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "airflow"), *args], env=self._control_env(), capture_output=True,
                              text=True, timeout=timeout, check=False, cwd=self.workdir)

    def _start_component(self, component: str) -> None:
        with open(self.workdir / f"{component}.log", "ab") as log:
            self._control[component] = subprocess.Popen(
                [str(VENV_BIN / "airflow"), component], env=self._control_env(), cwd=self.workdir,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_worker(self, name: str, *, concurrency: int = 2) -> None:
        """Boot node ``name`` (fresh: empty disks) running a Celery worker on this cluster's queue."""
        argv = ["airflow", "celery", "worker", "--queues", self.queue, "--concurrency", str(concurrency),
                "--celery-hostname", f"{name}@{name}", "--skip-serve-logs", "--without-mingle", "--without-gossip"]
        env = {**self.env, "AIRFLOW_HOME": "/tmp/airflow"}
        self.workers[name] = self.cluster.node(name).start(argv, log=self.workdir / f"{name}.log", env=env)

    def kill_worker(self, name: str) -> None:
        """Lose worker ``name``'s whole node at once (SIGKILL of its namespace: every task process on it dies)."""
        stop_node(self.workers.pop(name), kill=True)

    def _wait_healthy(self) -> None:
        import requests

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = {c: p.returncode for c, p in self._control.items() if p.poll() is not None}
            dead |= {w: p.returncode for w, p in self.workers.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"exited during start-up: {dead}\n{self.logs_tail()}")
            with contextlib.suppress(requests.RequestException, ValueError, KeyError):
                health = requests.get(f"{self.url}/api/v2/monitor/health", timeout=10).json()
                if all(health[k]["status"] == "healthy" for k in ("metadatabase", "scheduler", "triggerer",
                                                                  "dag_processor")):
                    return
            time.sleep(2)
        raise RuntimeError(f"Airflow not healthy after {STARTUP_TIMEOUT_S} s:\n{self.logs_tail()}")

    def logs_tail(self, chars: int = 3000) -> str:
        """The tail of every component's and worker's log, for failure messages."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def log_tail(self, chars: int = 6000) -> str:
        return self.logs_tail(chars // 2)

    # --- runs --------------------------------------------------------------------------------

    def wait_dag(self, dag_id: str, timeout_s: float = 300) -> None:
        """Wait until the dag-processor has serialized ``dag_id``, then unpause it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api("GET", f"/dags/{dag_id}", expect=None).status_code == 200:
                self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
                return
            time.sleep(2)
        raise AssertionError(f"DAG {dag_id} not loaded after {timeout_s} s; import errors: "
                             f"{self.api('GET', '/importErrors').json()}\n{self.logs_tail()}")

    def reparse(self, dag_id: str, timeout_s: float = 300) -> None:
        """Have the dag-processor parse ``dag_id``'s file now (``PUT /parseDagFile``) and wait until it has:
        the files are parsed once here (``min_file_process_interval``), and a DAG's next scheduled run is
        computed when its file is parsed (a catchup-off schedule unpaused later starts from then)."""
        dag = self.api("GET", f"/dags/{dag_id}").json()
        before, asked = dag["last_parsed_time"], 0.0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if time.monotonic() - asked > 60:  # again after a minute: a request that arrives while the file's
                # callbacks are being run is dropped (airflow/dag_processing/manager.py)
                self.api("PUT", f"/parseDagFile/{dag['file_token']}", expect=201)
                asked = time.monotonic()
            time.sleep(2)
            if self.api("GET", f"/dags/{dag_id}").json()["last_parsed_time"] != before:
                return
        raise AssertionError(f"{dag_id}'s file not parsed again within {timeout_s} s\n{self.logs_tail()}")

    def trigger(self, dag_id: str, run_id: str, conf: Mapping[str, object] | None = None) -> None:
        self.api("POST", f"/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None,
                                                          "conf": dict(conf or {})})

    def wait_running(self, dag_id: str, run_id: str, task_id: str, timeout_s: float = 900) -> dict:
        """Poll until ``task_id`` is running (on some worker); returns its task instance (``hostname``...)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ti = self.task_instances(dag_id, run_id).get(task_id)
            if ti and ti["state"] == "running" and ti.get("hostname"):
                return ti
            time.sleep(0.5)
        raise AssertionError(f"{task_id} never running: {self.task_states(dag_id, run_id)}\n{self.logs_tail()}")

    def asset_events(self, dag_id: str, run_id: str) -> list[dict]:
        """The asset events emitted by the tasks of one DAG run (``uri``, ``extra``, ``source_task_id``...)."""
        return self.api("GET", "/assets/events", params={"source_dag_id": dag_id, "source_run_id": run_id,
                                                         "limit": 100}).json()["asset_events"]

    # --- teardown ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the workers' nodes and every control-plane process group, then drop the database."""
        for name in list(self.workers):
            self.kill_worker(name)
        for proc in self._control.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._control.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._control.clear()
        self._drop_database()

    def _create_database(self) -> None:
        conn = self.cluster.pg_admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()

    def _drop_database(self) -> None:
        with contextlib.suppress(Exception):
            conn = self.cluster.pg_admin()
            try:
                with conn.cursor() as cur:
                    cur.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            finally:
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
