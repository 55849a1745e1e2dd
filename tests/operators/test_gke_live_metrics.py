"""GKE live metrics: the pod tracking URI check, the chart's
namespace-qualified URI, the curve kept when a pod never reached its live run, one RUNNING run
after a cleared task group. Tests that start a real ``mlflow server`` are marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import REPO
from tests.operators.test_gke import gke_context
from tests.storage.servers import hostname_mlflow_server
from tidal.launch.pods import pod_tracking_uri


@pytest.mark.parametrize("uri", [
    "http://mlflow:5000\n",  # `$` matches before a trailing newline (e.g. a value read from a file)
    "http://:5000",  # no host at all
    "http://mlflow:abc",  # not a port
    "http://mlflow:5000/?token=s3cr3t",  # a credential in the query: would land in XCom and the pod spec
    "http://mlflow:5000/#frag",  # a fragment breaks MLflow's REST URLs (base + /api/2.0/...)
    "http://[::ffff:127.0.0.1]:5000",  # IPv4-mapped loopback literal
])
def test_pod_tracking_uri_refuses_malformed_or_secret_bearing_uris(uri):
    assert pod_tracking_uri(uri) is None


def test_pod_tracking_uri_returns_none_for_an_unparsable_uri_instead_of_raising():
    """Documented: 'else None'. Actual: ValueError('Invalid IPv6 URL') from urlsplit."""
    assert pod_tracking_uri("http://[fd00::1:5000") is None


def test_pod_tracking_uri_accepts_an_uppercase_scheme():
    """RFC 3986 schemes are case-insensitive and MLflow accepts ``HTTPS://`` on the worker; the
    pod is refused live metrics and the log line calls the server 'not an MLflow server'."""
    assert pod_tracking_uri("HTTPS://mlflow.example.com") is not None


def prepare_context(tmp_path: Path, tiny_data: dict, monkeypatch, uri: str, run_id: str = "manual__1"):
    return gke_context(tmp_path, tiny_data, monkeypatch, uri, run_id)


def test_a_malformed_tracking_uri_does_not_fail_prepare(tmp_path, tiny_data, monkeypatch):
    """Live metrics are optional: a bad URI must mean 'no live run', not a failed prepare task."""
    dag, _, ti, context = prepare_context(tmp_path, tiny_data, monkeypatch, "http://[fd00::1:5000")
    assert dag.task_dict["train.prepare"].choose_branch(context) == ["train.launch", "train.commit"]
    assert ti.xcoms["mlflow_tracking_uri"] == ti.xcoms["mlflow_run_id"] == ""


def test_commit_keeps_the_metric_history_when_the_pod_never_reached_the_live_run(tmp_path, tiny_data, monkeypatch):
    """A pod that cannot reach MLflow (wrong DNS name, auth, outage) buffers its rows inside the
    pod; commit then records into the live run with history=None, so the step's MLflow run has
    no training curve at all, although metrics.jsonl holds it. (SQLite store: the live run is
    opened directly, standing in for a pod that never reached the server.)"""
    from mlflow.tracking import MlflowClient

    dag, pipe, ti, context = prepare_context(tmp_path, tiny_data, monkeypatch, f"sqlite:///{tmp_path / 'mlflow.db'}")
    dag.task_dict["train.prepare"].choose_branch(context)
    parent = pipe.parent_run(f"{dag.dag_id}__manual__1")
    step = pipe.graph["train"]
    live = pipe.tracker().open_step_run(parent, step.name, step.step_id, step.kind)
    ti.xcoms["mlflow_run_id"] = live  # what prepare pushes with a tracking server
    step_dir = Path(ti.xcoms["step_uri"])
    (step_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 4.0 - s}) + "\n" for s in (1, 2, 3)))
    (step_dir / "summary.json").write_text(json.dumps({"steps": 3, "final_train_loss": 1.0}))
    dag.task_dict["train.commit"].execute(context)
    client = MlflowClient(pipe.tracking_uri)
    assert client.get_run(live).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(live, "loss")] == [1, 2, 3]


@pytest.mark.parametrize("values", ["values-dev.yaml", "values-prod.yaml"])
def test_the_shipped_worker_tracking_uri_resolves_in_the_training_namespace(values):
    """Training pods run in ``training.namespace`` ("apart from Airflow's own",
    helm/tidal/templates/training-namespace.yaml; prod installs with ``-n airflow``), the
    tidal-mlflow Service in the release namespace. The worker's URI is handed to the pods as is,
    so a bare service name resolves to nothing there."""
    data = yaml.safe_load((REPO / "helm" / "tidal" / values).read_text())
    env = {e["name"]: e.get("value") for e in data["airflow"]["env"]}
    host = urlsplit(env["MLFLOW_TRACKING_URI"]).hostname
    assert "." in host, f"{values}: {host!r} resolves only in the release namespace, not in the pods'"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` reached by host name (a loopback URI is refused for pods)."""
    with hostname_mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.mark.slow
def test_a_cleared_and_rerun_prepare_leaves_one_running_live_run(tmp_path, tiny_data, monkeypatch, mlflow_server):
    """Clearing the task group (e.g. after a preempted pod) reruns prepare: it opens a second
    RUNNING child run, and the first one stays RUNNING for ever (nothing closes it)."""
    from mlflow.tracking import MlflowClient

    dag, _, ti, context = prepare_context(tmp_path, tiny_data, monkeypatch, mlflow_server)
    dag.task_dict["train.prepare"].choose_branch(context)
    first = ti.xcoms["mlflow_run_id"]
    assert first
    ti.xcoms.clear()  # Airflow clears a task's XComs when it is cleared
    dag.task_dict["train.prepare"].choose_branch(context)
    second = ti.xcoms["mlflow_run_id"]
    client = MlflowClient(mlflow_server)
    parent = client.get_run(second).data.tags["mlflow.parentRunId"]
    running = client.search_runs([client.get_run(second).info.experiment_id],
                                 filter_string=f"tags.`mlflow.parentRunId` = '{parent}' "
                                               "and attributes.status = 'RUNNING'")
    assert [r.info.run_id for r in running] == [second], f"first live run {first} left RUNNING"
