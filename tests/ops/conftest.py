"""A real `airflow standalone` on a fresh PostgreSQL database, for the operations tests.

The server runs in its own process group (killed as a group at teardown) with LocalExecutor,
the simple auth manager (one admin user whose password the fixture writes), tidal's DAG file,
plugin and two small recipes: ``ops_ci`` (manual) and ``ops_nightly`` (the same computation on
a schedule, with a baseline). The scheduler's own cron loop is off
(``[scheduler] use_job_schedule = False``) so that only the runs a test asks for exist;
``airflow backfill create`` and REST triggers still run.

No PostgreSQL on 127.0.0.1:5432: the tests skip with that reason, except under ``CI=true``
where they fail. A webhook receiver (HTTP) and a StatsD receiver (UDP) listen on loopback
and the server's tasks are pointed at them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.ops.airflow_api import AirflowApi
from tests.ops.recipes import write_ops_recipe
from tests.ports import free_port

VENV_BIN = Path(sys.executable).parent
PG = {"host": "127.0.0.1", "port": 5432}
STARTUP_TIMEOUT_S = 420
ADMIN_PASSWORD = "tidal-ops-" + secrets.token_hex(6)


def unavailable(reason: str) -> None:
    """Skip with ``reason`` outside CI; fail under ``CI=true`` (the server must be there)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory):
    """A fresh database ``tidal_ops_<hex>`` on 127.0.0.1:5432, dropped after the session.

    Airflow 3.3 also opens the metadata DB through an async engine (``sql_alchemy_conn_async``;
    the execution API checks task tokens with it), which on PostgreSQL uses ``asyncpg`` (locked).
    """
    try:
        import psycopg2
    except ImportError as err:  # pragma: no cover - locked dependency
        unavailable(f"psycopg2 not importable: {err}")
    admin = None
    for user in ("postgres", "root"):
        try:
            admin = psycopg2.connect(dbname="postgres", user=user, connect_timeout=5, **PG)
            break
        except psycopg2.OperationalError as err:
            last = err
    if admin is None:
        unavailable(f"no PostgreSQL server reachable on 127.0.0.1:5432: {str(last).strip()}")
    admin.autocommit = True
    name = f"tidal_ops_{uuid.uuid4().hex[:10]}"
    user = admin.get_dsn_parameters()["user"]
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://{user}@127.0.0.1:5432/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                        "pg_backend_pid()", (name,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


class Receivers:
    """Loopback webhook (HTTP POST bodies as JSON) and StatsD (UDP lines) receivers."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.statsd_lines: list[str] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.http = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.5)
        self._stop = False
        threading.Thread(target=self._read_udp, daemon=True).start()

    def _read_udp(self) -> None:
        while not self._stop:
            try:
                self.statsd_lines.append(self.udp.recv(65536).decode())
            except (TimeoutError, OSError):
                continue

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_port}/alert"

    @property
    def statsd_port(self) -> int:
        return self.udp.getsockname()[1]

    def close(self) -> None:
        self._stop = True
        self.http.shutdown()
        self.http.server_close()
        self.udp.close()


class Airflow(AirflowApi):
    """A running standalone server: its URL, a token-authenticated REST client, its environment."""

    def __init__(self, base: Path, env: dict[str, str], port: int, receivers: Receivers):
        super().__init__(f"http://127.0.0.1:{port}", ADMIN_PASSWORD, base / "standalone.log")
        self.base, self.env, self.receivers = base, env, receivers
        self.recipes = base / "recipes"
        self.storage = base / "storage"
        self.faults = base / "faults"

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run an ``airflow`` CLI command against the same metadata DB."""
        return subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=REPO)


def component_tails(log_file: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of each ``airflow standalone`` component (its lines start ``name |``):
    the DAG processor's chatter would otherwise push the scheduler's and API server's out of a tail."""
    by_component: dict[str, list[str]] = {}
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    for line in text.splitlines():
        name = line.split("|", 1)[0].strip() if "|" in line[:20] else "?"
        by_component.setdefault(name, []).append(line)
    return "\n".join(f"--- {name} (last {lines} lines)\n" + "\n".join(kept[-lines:])
                     for name, kept in by_component.items()) or "(no log)"


@pytest.fixture(scope="session")
def airflow_server(tmp_path_factory, postgres_url):
    """Start ``airflow standalone`` (own process group) and yield an :class:`Airflow`; stop the group after."""
    import requests

    base = tmp_path_factory.mktemp("standalone")
    home = base / "airflow"
    home.mkdir()
    recipes, storage = base / "recipes", base / "storage"
    recipes.mkdir()
    write_ops_recipe(recipes / "ops_ci.yaml", storage)
    write_ops_recipe(recipes / "ops_nightly.yaml", storage, name="ops_nightly", schedule="@daily",
                     baseline={"file": "baselines/ops_nightly.json", "loss_tolerance": 0.05, "stats_tolerance": 0.01})
    (base / "faults").mkdir()
    (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": ADMIN_PASSWORD}))
    receivers = Receivers()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__", "MLFLOW_", "TIDAL_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "3",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        # a task's supervisor gives the execution API 5 s per call by default; on a loaded 2-core CI machine one
        # call took 78 s and the task was killed before it started (plan: SIGKILL, the whole run upstream_failed)
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "120",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        # no recipe changes while it runs: each DAG file is parsed when found, not again every 30 s
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": str(REPO),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # standalone starts `airflow` children
        "TIDAL_RECIPES_DIR": str(recipes),
        "TIDAL_FAULT_DIR": str(base / "faults"),
        "TIDAL_ALERT_WEBHOOK_URL": receivers.webhook_url,
        "TIDAL_STATSD_HOST": "127.0.0.1",
        "TIDAL_STATSD_PORT": str(receivers.statsd_port),
        "RAYON_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    server = Airflow(base, env, port, receivers)
    storage.mkdir(parents=True, exist_ok=True)
    # Create the embedded MLflow store once, before parallel tasks open it: MLflow's SQLite
    # migrations are not safe to run from several processes at once (a half-done migration
    # leaves `_alembic_tmp_experiments` behind and every later open fails).
    init = subprocess.run([sys.executable, "-c", ("import sys; from mlflow.tracking import MlflowClient; "
                           "from tidal.core.load import load_pipeline; "
                           "MlflowClient(load_pipeline(sys.argv[1]).tracking_uri).search_experiments()"),
                           str(recipes / "ops_ci.yaml")], env=env, capture_output=True, text=True, timeout=300,
                          check=False, cwd=REPO)
    assert init.returncode == 0, init.stderr[-3000:]
    migrate = server.cli("db", "migrate", timeout=600)
    assert migrate.returncode == 0, (migrate.stdout + migrate.stderr)[-4000:]
    log = open(server.log_file, "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([str(VENV_BIN / "airflow"), "standalone"], env=env, cwd=base, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        healthy, last = False, "no answer yet"
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = requests.get(f"{server.url}/api/v2/monitor/health", timeout=10).json()
                last = json.dumps(health)
                if health["metadatabase"]["status"] == "healthy" and health["scheduler"]["status"] == "healthy":
                    healthy = True
                    break
            except (requests.RequestException, ValueError, KeyError, TypeError) as err:
                last = f"{type(err).__name__}: {err}"
            time.sleep(3)
        assert healthy, (f"standalone not healthy after {STARTUP_TIMEOUT_S} s (exit {proc.poll()}); last health answer "
                         f"from port {port}: {last}\n{component_tails(server.log_file)}")
        server.login()
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # children that outlived the leader are still in the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        receivers.close()
        keep = REPO / "test-artifacts"
        keep.mkdir(exist_ok=True)
        shutil.copy(server.log_file, keep / "standalone.log")
