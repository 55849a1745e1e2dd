"""Tracking across pods: calls buffered while MLflow is down are objects under an s3:// root,
replayed from another machine (another cwd, another cache) into a real MLflow server, first of
all by the report; and a per-machine tracking store next to a shared root is refused to Airflow
tasks, noted by ``tidal plan``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.storage.servers import free_port, kill_mlflow_server, start_mlflow_server
from tidal.storage import StorageSettings, open_storage
from tidal.tracking import PENDING_PREFIX, Tracker
from tidal.tracking import client as tracking_client
from tidal.tracking.tracker import PENDING_OBJECTS


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` (SQLite store) on loopback for this module; yields its URL."""
    port = free_port()
    proc = start_mlflow_server(port, tmp_path_factory.mktemp("mlflow"))
    yield f"http://127.0.0.1:{port}"
    kill_mlflow_server(proc)


@pytest.fixture
def offline(monkeypatch):
    """MLflow's HTTP client fails fast, the unreachable hold starts empty, no pending dir is set."""
    monkeypatch.setattr(tracking_client, "_unreachable_until", {})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv("TIDAL_TRACKING_PENDING_DIR", raising=False)
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_buffered_calls_are_objects_replayed_by_a_fresh_tracker_elsewhere(bucket, mlflow_server, offline, tmp_path,
                                                                           monkeypatch):
    from mlflow.tracking import MlflowClient

    root = f"s3://{bucket}/track"
    first_pod, second_pod = tmp_path / "pod-a", tmp_path / "pod-b"
    first_pod.mkdir()
    second_pod.mkdir()
    monkeypatch.chdir(first_pod)
    store = open_storage(root, settings=StorageSettings(cache_dir=str(first_pod / "cache")))
    down = Tracker(offline, "tidal-shared", store=store, attempts=1, backoff_s=0.01)
    assert down.pending_dir is None and down.pending_where.endswith(PENDING_OBJECTS)
    parent = down.parent_run("dag__run-1", {"seed": 7}, {"tidal.recipe": "tiny"})
    assert parent == PENDING_PREFIX + "dag__run-1"
    down.log_step(parent, "stats", "stats-0123456789ab", "stats", "run", {"rows": 3})
    down.finish(parent, "success")
    names = store.list_rel(PENDING_OBJECTS)
    assert len(names) == 3 and all(n.endswith(".json") for n in names)
    assert [n.split("-")[1] for n in (name.rsplit("/", 1)[-1] for name in names)] == ["parent_run", "log_step",
                                                                                      "finish"]
    assert list(first_pod.rglob("*.json")) == []  # nothing on this pod's disk (no ./mlflow-pending)
    shutil.rmtree(first_pod)  # the pod is gone with its disk

    monkeypatch.chdir(second_pod)
    # the server is up: MLflow's own HTTP retries and timeout again (the offline fixture's 5 s, no retry, failed
    # this replay on a loaded CI machine)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    other = open_storage(root, settings=StorageSettings(cache_dir=str(second_pod / "cache")))
    up = Tracker(mlflow_server, "tidal-another-recipe", store=other)  # one buffer holds every recipe's calls
    assert up.replay_pending() == 3
    assert other.list_rel(PENDING_OBJECTS) == []
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("tidal-shared")
    [run] = client.search_runs([experiment.experiment_id], "tags.`tidal.run_key` = 'dag__run-1'")
    assert run.data.params["seed"] == "7" and run.info.status == "FINISHED"
    assert run.data.tags["tidal.step_id.stats"] == "stats-0123456789ab"
    assert client.get_experiment_by_name("tidal-another-recipe") is None
    assert up.replay_pending() == 0


def test_the_report_replays_the_buffer_first(bucket, mlflow_server, offline, tmp_path, monkeypatch):
    from tidal.core.load import load_pipeline
    from tidal.core.report import build_report

    root = f"s3://{bucket}/report"
    monkeypatch.setenv("TIDAL_STORAGE_CACHE", str(tmp_path / "cache-a"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", offline)
    task = load_pipeline(TINY, storage_root=root)
    assert task.parent_run("tidal_tiny__manual-1") == PENDING_PREFIX + "tidal_tiny__manual-1"
    assert len(task.storage.list_rel(PENDING_OBJECTS)) == 1
    shutil.rmtree(tmp_path / "cache-a", ignore_errors=True)

    monkeypatch.setenv("TIDAL_STORAGE_CACHE", str(tmp_path / "cache-b"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    report = build_report(load_pipeline(TINY, storage_root=root), "tidal_tiny__manual-1")
    assert report["replayed"] == 1 and "mlflow_error" not in report, report
    assert report["mlflow_run_id"] and report["run_key"] == "tidal_tiny__manual-1"


def test_plan_notes_and_airflow_tasks_refuse_a_per_machine_store_with_a_shared_root(bucket, tmp_path, monkeypatch,
                                                                                     capsys):
    from operators.run_context import SharedTrackingRequired, pipeline_for_run
    from tidal.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", f"s3://{bucket}/refuse")
    assert main(["plan", str(TINY)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: storage root")]
    assert len(notes) == 1 and "need an MLflow server (set MLFLOW_TRACKING_URI" in notes[0], notes
    with pytest.raises(SharedTrackingRequired, match="set MLFLOW_TRACKING_URI"):
        pipeline_for_run(str(TINY), {"params": {}})
    assert pipeline_for_run(str(TINY), {"params": {}}, check_tracking=False).storage.uri.startswith("s3://")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")  # a server: fine
    assert pipeline_for_run(str(TINY), {"params": {}}).tracking_problem() is None
    assert main(["plan", str(TINY)]) == 0
    assert "MLflow server" not in capsys.readouterr().out

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path / "local-root"))  # one machine: SQLite is right
    assert pipeline_for_run(str(TINY), {"params": {}}).tracking_problem() is None


def test_a_sqlite_store_keeps_its_buffer_beside_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TIDAL_TRACKING_PENDING_DIR", raising=False)
    local = open_storage(str(tmp_path / "root"))
    tracker = Tracker(f"sqlite:///{tmp_path / 'root' / 'mlflow.db'}", "tidal-x", store=local)
    assert tracker.pending_dir == tmp_path / "root" / "pending"
    monkeypatch.setenv("TIDAL_TRACKING_PENDING_DIR", str(tmp_path / "explicit"))
    assert Tracker("http://127.0.0.1:9", "tidal-x", store=local).pending_dir == Path(tmp_path / "explicit")
    monkeypatch.delenv("TIDAL_TRACKING_PENDING_DIR")
    assert Tracker("http://127.0.0.1:9", "tidal-x", store=local).pending_dir is None
    assert Tracker("http://127.0.0.1:9", "tidal-x").pending_dir == Path("mlflow-pending")
    assert os.environ.get("TIDAL_TRACKING_PENDING_DIR") is None
