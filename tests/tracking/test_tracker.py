"""Tracking against a real SQLite MLflow store in tmp_path, and against an unreachable server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tidal.tracking import PENDING_PREFIX, Tracker, flatten_params, tracking_uri_for

EXPERIMENT = "tidal-test"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str]:
    """One SQLite store for the module (MLflow's first-use migrations take seconds)."""
    root = tmp_path_factory.mktemp("storage")
    return root, f"sqlite:///{root}/mlflow.db"


def test_tracking_uri_default_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri_for(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking_uri_for(tmp_path) == "http://mlflow:5000"


def test_flatten_params_respects_mlflow_limits():
    flat = flatten_params({"model": {"d_model": 64, "layers": [1, 2]}, "long": "x" * 7000, "k" * 300: 1, "a b$c": 2})
    assert flat["model.d_model"] == "64" and flat["model.layers"] == "[1, 2]"
    assert len(flat["long"]) == 6000
    assert all(len(k) <= 250 for k in flat) and "a b_c" in flat


def test_parent_run_is_found_again_from_another_process(store):
    root, uri = store
    tracker = Tracker(uri, EXPERIMENT)
    params = {"seed": 1, "model": {"d_model": 64}}
    run_id = tracker.parent_run("dagrun-1", params, {"tidal.recipe": "tiny"})
    assert not run_id.startswith(PENDING_PREFIX)
    code = ("import sys; from tidal.tracking import Tracker; "
            f"print(Tracker({uri!r}, {EXPERIMENT!r}).parent_run('dagrun-1', {{}}, {{}}))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert other.stdout.strip().splitlines()[-1] == run_id
    assert Tracker(uri, EXPERIMENT).parent_run("dagrun-1", {}, {}) == run_id
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.params["model.d_model"] == "64" and run.data.tags["tidal.recipe"] == "tiny"
    assert run.data.tags["tidal.run_key"] == "dagrun-1"
    assert Tracker(uri, EXPERIMENT).parent_run("dagrun-2", {}, {}) != run_id
    exp = MlflowClient(uri).get_experiment_by_name(EXPERIMENT)
    assert exp.artifact_location == (root / "mlartifacts").as_uri()


def test_log_step_nested_run_tags_metrics_history_artifacts(store, tmp_path):
    _, uri = store
    tracker = Tracker(uri, EXPERIMENT)
    parent = tracker.parent_run("dagrun-steps", {"seed": 1}, {})
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.html").write_text("<html></html>")
    history = [{"step": s, "loss": 4.0 - 0.1 * s, "tokens_per_second": 1e4 + s} for s in range(0, 50, 10)]
    child = tracker.log_step(
        parent, "train", "train-0123456789ab", "train", "run",
        summary={"final_loss": 3.6, "tokens": 12345, "note": "ok"}, history=history,
        artifacts=[tmp_path / "summary.json", tmp_path / "docs"],
        tags={"tidal.tokenizer_hash": "abc123", "tidal.checkpoint_root_hash": "def456"},
    )
    skipped = tracker.log_step(parent, "mix", "mix-aaaaaaaaaaaa", "mix", "skip", {}, None, [], {})
    tracker.finish(parent, "success")

    client = MlflowClient(uri)
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.info.run_name == "train" and run.info.status == "FINISHED"
    assert {k: run.data.tags[k] for k in ("tidal.step_id", "tidal.kind", "tidal.status", "tidal.tokenizer_hash",
                                          "tidal.checkpoint_root_hash", "note")} == {
        "tidal.step_id": "train-0123456789ab", "tidal.kind": "train", "tidal.status": "run",
        "tidal.tokenizer_hash": "abc123", "tidal.checkpoint_root_hash": "def456", "note": "ok"}
    assert run.data.metrics["final_loss"] == pytest.approx(3.6) and run.data.metrics["tokens"] == 12345
    losses = client.get_metric_history(child, "loss")
    assert [(m.step, round(m.value, 6)) for m in sorted(losses, key=lambda m: m.step)] == [
        (s, round(4.0 - 0.1 * s, 6)) for s in range(0, 50, 10)]
    assert len(client.get_metric_history(child, "tokens_per_second")) == 5
    assert {a.path for a in client.list_artifacts(child)} == {"summary.json", "docs"}
    assert client.get_run(skipped).data.tags["tidal.status"] == "skip"
    parent_run = client.get_run(parent)
    assert parent_run.data.tags["tidal.step_id.train"] == "train-0123456789ab"
    assert parent_run.data.tags["tidal.step_id.mix"] == "mix-aaaaaaaaaaaa"
    assert parent_run.info.status == "FINISHED"
    children = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert {c.info.run_id for c in children} == {child, skipped}


def test_summary_is_logged_at_the_last_step_and_never_doubles_a_curve(store):
    """Issue 21, item 7: a summary value that has a curve (``eval_loss/x``) adds no point to it
    (the old step-0 point drew the curve as a V); other numbers sit at the run's last step."""
    _, uri = store
    tracker = Tracker(uri, EXPERIMENT)
    parent = tracker.parent_run("dagrun-summary", {}, {})
    history = [{"step": s, "loss": 4.0 - s / 100, **({"eval_loss/x": 5.0 - s / 50} if s % 20 == 0 else {})}
               for s in range(10, 70, 10)]
    summary = {"steps": 60, "final_train_loss": 3.4, "eval_loss/x": 3.8, "eval_loss": 3.8, "mesh": "1x1"}
    child = tracker.log_step(parent, "train", "train-0123456789ab", "train", "run", summary, history)
    client = MlflowClient(uri)
    evals = client.get_metric_history(child, "eval_loss/x")
    assert sorted(m.step for m in evals) == [20, 40, 60]  # the history's points, no step 0
    assert [m.value for m in sorted(evals, key=lambda m: m.step)] == pytest.approx([4.6, 4.2, 3.8])
    assert [m.step for m in client.get_metric_history(child, "final_train_loss")] == [60]
    assert [m.step for m in client.get_metric_history(child, "eval_loss")] == [60]
    assert client.get_run(child).data.tags["mesh"] == "1x1"
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_finish_logs_final_metrics_on_the_parent_even_after_an_outage(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    _, uri = store
    up = Tracker(uri, EXPERIMENT, pending_dir=tmp_path)
    parent = up.parent_run("dagrun-final", {}, {})
    down = Tracker("http://127.0.0.1:9", EXPERIMENT, pending_dir=tmp_path, attempts=1, backoff_s=0.01)
    down.finish(parent, "success", metrics={"final_train_loss": 3.25, "mfu": 0.4, "mesh": "1x1"}, step=60)
    assert up.replay_pending() == 1
    run = MlflowClient(uri).get_run(parent)
    assert run.info.status == "FINISHED" and run.data.metrics == {"final_train_loss": 3.25, "mfu": 0.4}
    assert [m.step for m in MlflowClient(uri).get_metric_history(parent, "mfu")] == [60]


def test_unreachable_server_buffers_then_replays(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    pending = tmp_path / "pending"
    down = Tracker("http://127.0.0.1:9", EXPERIMENT, pending_dir=pending, attempts=2, backoff_s=0.01)
    parent = down.parent_run("dagrun-offline", {"seed": 7}, {"tidal.recipe": "tiny"})
    assert parent == PENDING_PREFIX + "dagrun-offline"
    assert down.log_step(parent, "gate", "gate-0123456789ab", "gate", "run", {"gate_success": 1},
                         [{"step": 1, "x": 1.0}], [], {}) is None
    down.finish(parent, "failed")
    files = sorted(pending.glob("*.json"))
    assert [json.loads(f.read_text())["op"] for f in files] == ["parent_run", "log_step", "finish"]

    _, uri = store
    up = Tracker(uri, EXPERIMENT, pending_dir=pending, attempts=1)
    assert up.replay_pending() == 3
    assert not list(pending.glob("*.json"))
    real_parent = up.parent_run("dagrun-offline", {}, {})
    client = MlflowClient(uri)
    run = client.get_run(real_parent)
    assert run.data.params["seed"] == "7" and run.info.status == "FAILED"
    assert run.data.tags["tidal.step_id.gate"] == "gate-0123456789ab"


def test_unreachable_uri_is_not_retried_again_within_the_hold(tmp_path, monkeypatch):
    """After one full round of failed retries, later calls go straight to the pending buffer."""
    import time

    from tidal.tracking import client

    monkeypatch.setattr(client, "_unreachable_until", {})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    down = Tracker("http://127.0.0.1:9", EXPERIMENT, pending_dir=tmp_path, attempts=2, backoff_s=0.2)
    started = time.perf_counter()
    down.parent_run("dagrun-a", {}, {})
    first = time.perf_counter() - started
    assert first >= 0.2  # slept between its two tries
    started = time.perf_counter()
    for index in range(5):
        down.log_step(PENDING_PREFIX + "dagrun-a", f"s{index}", f"s{index}-0123456789ab", "fetch", "skip", {}, None,
                      [], {})
    assert time.perf_counter() - started < first  # five calls, no retries, no sleeps
    assert len(list(tmp_path.glob("*.json"))) == 6


def test_processes_opening_a_fresh_store_at_once_all_succeed(tmp_path):
    """Parallel Airflow tasks on a new storage root: the first-open migration runs once, under a lock."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import logging, sys; logging.basicConfig(level=logging.WARNING); "
            "logging.getLogger('tidal.tracking').setLevel(logging.DEBUG); from tidal.tracking import Tracker; "
            f"t = Tracker({uri!r}, {EXPERIMENT!r}); print(t.parent_run(sys.argv[1], {{}}, {{}}))")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"run-{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    # Without the lock, alembic races ("table _alembic_tmp_... already exists") and calls are retried.
    assert not [err for _, err in outs if "failed (try" in err], [err[-2000:] for _, err in outs]
    run_ids = [out.strip().splitlines()[-1] for out, _ in outs]
    assert not any(r.startswith(PENDING_PREFIX) for r in run_ids), run_ids
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert {r.info.run_id for r in client.search_runs([exp.experiment_id])} == set(run_ids)


def test_safe_uri_drops_credentials_query_strings_and_fragments():
    from tidal.tracking.tracker import safe_uri

    text = "MLflow at http://user:secret@host:5000/api?token=secret#frag and s3://b/p?X-Amz-Signature=secret."
    assert safe_uri(text) == "MLflow at http://host:5000/api and s3://b/p"
    assert "secret" not in safe_uri("sqlite:////tmp/x.db?mode=ro") and safe_uri("http://h:1/") == "http://h:1/"
