"""A client of Airflow's REST API v2 (simple auth manager user ``admin``, JWT), shared by the
operations tests (``airflow standalone``) and the production-shape cluster (tests/cluster/airflow_cluster.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class AirflowApi:
    """Token-authenticated calls to ``{url}/api/v2`` and the polling the tests need.

    Attributes:
        url: the API server's base URL (``http://127.0.0.1:PORT``).
        password: the ``admin`` user's password.
        log_file: a log whose tail goes into timeout messages.
    """

    def __init__(self, url: str, password: str, log_file: Path):
        self.url, self.password, self.log_file = url, password, log_file
        self.token: str | None = None

    def login(self) -> str:
        """A JWT from ``POST /auth/token`` (simple auth manager user ``admin``)."""
        import requests

        response = requests.post(f"{self.url}/auth/token", json={"username": "admin", "password": self.password},
                                 timeout=60)
        assert response.status_code == 201, response.text
        self.token = response.json()["access_token"]
        return self.token

    def api(self, method: str, path: str, expect: int | None = 200, **kwargs: Any) -> Any:
        """Call ``/api/v2{path}`` with the bearer token; check the status when ``expect`` is set."""
        import requests

        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        response = requests.request(method, f"{self.url}/api/v2{path}", timeout=120, headers=headers, **kwargs)
        if expect is not None:
            assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text[:2000]}"
        return response

    def wait_run(self, dag_id: str, run_id: str, states: tuple[str, ...] = ("success", "failed"),
                 timeout_s: float = 900) -> dict[str, Any]:
        """Poll a DAG run until its state is one of ``states``; fails with the server log tail on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()
            if run["state"] in states:
                return run
            time.sleep(3)
        raise AssertionError(f"{dag_id} {run_id} not in {states} after {timeout_s} s; last state "
                             f"{run['state']}; TIs: {self.task_states(dag_id, run_id)}\n{self.log_tail()}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """task_id -> task instance (state, try_number, duration, ...) of one run."""
        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
        return {ti["task_id"]: ti for ti in tis["task_instances"]}

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {k: v["state"] for k, v in self.task_instances(dag_id, run_id).items()}

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        """The task's return value (deserialized)."""
        entry = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
                         params={"deserialize": "true"}).json()
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) and value.startswith("{") else value

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The text of a task attempt's log."""
        response = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                            params={"full_content": "true"}, headers={"Accept": "application/json"})
        content = response.json().get("content")
        if isinstance(content, list):  # structured entries: event, level, error_detail, ...
            return "\n".join(json.dumps(c) if isinstance(c, dict) else str(c) for c in content)
        return str(content)

    def why_failed(self, dag_id: str, run_id: str, chars: int = 3000) -> str:
        """A run's task states, then the log tail of each failed task's last try and of the server (for an
        assertion's message: a failed run on a CI machine is diagnosed from this alone)."""
        tis = self.task_instances(dag_id, run_id)
        parts = [repr({k: v["state"] for k, v in tis.items()})]
        for task_id, ti in tis.items():
            if ti["state"] == "failed":
                try:
                    log = self.task_log(dag_id, run_id, task_id, max(1, ti["try_number"]))
                except Exception as err:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
                    log = f"(log unreadable: {err})"
                parts.append(f"--- {task_id} try {ti['try_number']}\n{log[-chars:]}")
        return "\n".join([*parts, "--- server", self.log_tail(chars)])

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_file.read_text(errors="replace")[-chars:] if self.log_file.exists() else "(no log)"
