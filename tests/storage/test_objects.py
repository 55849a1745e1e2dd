"""Shared state as objects under the root (docs/architecture.md §0): the object API on both backends, the
failure catalog and failed-attempt evidence seen from another "pod" (another cache directory,
the first one deleted), and scratch staleness decided by the lease and by age, never by a pid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.core.pipeline import attempt_files
from tidal.core.runner import run_step
from tidal.steps import Step
from tidal.storage import SCRATCH, StorageSettings, open_storage

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """A storage root of each backend (the S3 one on the moto server)."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/shared"


def pod(root: str, cache: Path, **settings) -> object:
    """The root as another pod opens it: its own (empty) cache directory."""
    return open_storage(root, settings=StorageSettings(cache_dir=str(cache), **settings))


def test_object_api_round_trip(root, tmp_path):
    storage = pod(root, tmp_path / "cache-a")
    uri = storage.write_object("failures/fp1/b.json", b'{"n": 2}')
    storage.write_object("failures/fp1/a.json", b'{"n": 1}')
    storage.write_object("failures/fp2/deep/c.json", b"{}")
    storage.write_object("failuresX/d.json", b"{}")
    assert uri == storage.object_uri("failures/fp1/b.json")
    assert uri.startswith("s3://") == root.startswith("s3://")
    other = pod(root, tmp_path / "cache-b")
    assert other.read_object("failures/fp1/b.json") == b'{"n": 2}'
    assert other.read_object("failures/fp1/missing.json") is None
    assert other.list_rel("failures/") == ["failures/fp1/a.json", "failures/fp1/b.json", "failures/fp2/deep/c.json"]
    assert other.list_rel("failures/fp1/a") == ["failures/fp1/a.json"]
    assert other.list_rel("nothing/") == []
    storage.write_object("failures/fp1/a.json", b"replaced")  # overwrite is whole
    assert other.read_object("failures/fp1/a.json") == b"replaced"
    other.delete_rel(["failures/fp1/a.json", "failures/fp1/never-was.json"])
    assert storage.list_rel("failures/fp1/") == ["failures/fp1/b.json"]
    for bad in ("../escape.json", "/etc/passwd", "a//b.json", "a/./b.json", "", "a/"):
        with pytest.raises(ValueError):
            storage.write_object(bad, b"x")
    with pytest.raises(ValueError):
        storage.list_rel("../")


def test_a_failure_recorded_in_one_pod_is_listed_by_another(bucket, tmp_path):
    from tidal.tracking.failures import build_record, list_failures, record_failure

    root = f"s3://{bucket}/catalog"
    first = pod(root, tmp_path / "cache-a")
    try:
        raise ValueError("disk full")
    except ValueError as err:
        record = build_record(err, dag_id="tidal_tiny", task_id="stats", recipe="tiny", step_id="stats-abc")
    uri = record_failure(first, record)
    assert uri.startswith(f"s3://{bucket}/catalog/failures/{record['fingerprint']}/") and uri.endswith(".json")
    shutil.rmtree(tmp_path / "cache-a", ignore_errors=True)  # the pod is gone
    second = pod(root, tmp_path / "cache-b")
    [seen] = list_failures(second, "tiny")
    assert seen["message"] == "disk full" and seen["fingerprint"] == record["fingerprint"]
    assert seen["file"].startswith(f"failures/{record['fingerprint']}/")
    assert list_failures(second, "other-recipe") == []
    out = subprocess.run([str(VENV_BIN / "tidal"), "failures", "--storage-root", root], capture_output=True,
                         text=True, timeout=120, check=True).stdout  # the CLI of a third machine
    assert f"failure catalog s3://{bucket}/catalog/failures/: 1 failure(s)" in out and "disk full" in out


def test_failed_attempt_evidence_survives_the_pod_and_is_bounded(root, tmp_path):
    first = pod(root, tmp_path / "cache-a", failed_attempts_kept=3)
    step = Step("writer", "fixture", {"parts": 3, "pause_s": 0.0, "fail_at": 2})
    with pytest.raises(RuntimeError, match="injected failure at part 2"):
        run_step(step, first)
    assert not first.is_committed(step.step_id)
    if root.startswith("s3://"):
        assert list((first.local_dir / SCRATCH).iterdir()) == []  # uploaded, then removed locally
        shutil.rmtree(tmp_path / "cache-a")  # the pod and its disk are gone
    second = pod(root, tmp_path / "cache-b", failed_attempts_kept=3)
    [attempt] = second.failed_attempts(step.step_id)
    assert attempt.startswith(f".failed/{step.step_id}.") and attempt.endswith("/")
    assert second.read_object(attempt + "part-1.txt") == b"writer part 1 seed None\n"
    assert second.read_object(attempt + "_SUCCESS") is None

    gate_id = "gate-0123456789ab"
    for n in range(5):  # a gate that keeps failing: only the newest three attempts stay
        scratch = second.new_scratch(gate_id)
        (scratch / "gate_result.json").write_text(json.dumps({"success": False, "n": n}))
        (scratch / "data_docs").mkdir()
        (scratch / "data_docs" / "index.html").write_text(f"<html>attempt {n}</html>")
        where = second.keep_failed(scratch, gate_id)
        assert not scratch.exists() and where.rstrip("/").endswith(second.failed_attempts(gate_id)[-1].rstrip("/"))
    attempts = pod(root, tmp_path / "cache-c").failed_attempts(gate_id)
    assert [json.loads(second.read_object(a + "gate_result.json"))["n"] for a in attempts] == [2, 3, 4]
    assert second.read_object(attempts[-1] + "data_docs/index.html") == b"<html>attempt 4</html>"
    # what MLflow gets as the FAILED nested run's artifacts (downloaded from the bucket)
    files = attempt_files(second, attempts[-1], ("gate_result.json", "data_docs", "absent.json"), tmp_path / "dl")
    assert [p.name for p in files] == ["gate_result.json", "data_docs"]
    assert (files[1] / "index.html").read_text() == "<html>attempt 4</html>"
    second.clear_attempts(gate_id)
    assert second.failed_attempts(gate_id) == [] and second.list_rel(f".failed/{gate_id}.") == []
    assert second.failed_attempts(step.step_id) == [attempt]  # another step's attempts stay


def test_the_report_reads_a_failed_gate_from_another_pod(bucket, tmp_path, monkeypatch):
    from tests.conftest import TINY
    from tidal.core.load import load_pipeline
    from tidal.core.report import build_report, format_report

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = f"s3://{bucket}/report"
    monkeypatch.setenv("TIDAL_STORAGE_CACHE", str(tmp_path / "cache-a"))
    gate = load_pipeline(TINY, storage_root=root)
    gate_id = gate.graph["gate"].step_id
    scratch = gate.storage.new_scratch(gate_id)
    (scratch / "gate_result.json").write_text(json.dumps({"success": False, "summary": "total_tokens: expected "
                                                          ">= 1e+12, got 1234"}))
    (scratch / "data_docs").mkdir()
    (scratch / "data_docs" / "index.html").write_text("<html>docs</html>")
    gate.storage.keep_failed(scratch, gate_id)
    shutil.rmtree(tmp_path / "cache-a")
    monkeypatch.setenv("TIDAL_STORAGE_CACHE", str(tmp_path / "cache-b"))
    report = build_report(load_pipeline(TINY, storage_root=root))
    assert report["gate"].startswith(f"FAILED (s3://{bucket}/report/.failed/{gate_id}.")
    assert "got 1234" in report["gate"]
    assert report["gate_data_docs"] == report["gate_evidence"] + "data_docs/index.html"
    assert f"data docs:     {report['gate_data_docs']}" in format_report(report)


def _old(path: Path, age_s: float) -> None:
    then = time.time() - age_s
    for item in [path, *path.rglob("*")]:
        os.utime(item, (then, then))


def _foreign_scratch(storage, step_id: str, name: str) -> Path:
    """A scratch directory as another pod leaves it: a pid that means nothing here."""
    path = storage.local_dir / SCRATCH / f"{step_id}.{name}"
    path.mkdir(parents=True)
    (path / "part-0.txt").write_text("being written elsewhere")
    return path


def test_a_live_scratch_of_another_pod_is_not_deleted(root, tmp_path):
    storage = pod(root, tmp_path / "cache", lease_ttl_s=30.0)
    step_id = "writer-0123456789ab"
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                              capture_output=True, text=True).stdout.strip()
    live = _foreign_scratch(storage, step_id, f"{dead_pid}.aaaaaaaa")  # fresh: written moments ago
    job = live.with_name(live.name + ".job")
    job.mkdir()
    (job / "config.json").write_text("{}")
    _old(job, 3600)  # a Beam job's config is old, but its scratch is being written: both stay
    mine = storage.new_scratch(step_id)
    assert live.is_dir() and job.is_dir() and mine.is_dir() and mine != live

    _old(live, 3600)  # nothing written for an hour, but another worker holds the step's lease
    leases = storage.lease(step_id).store  # held by a worker in another process (written as it would)
    held = {"step_id": step_id, "owner": "elsewhere:1:abcd", "expires_unix": time.time() + 30, "released": False}
    assert leases.create(step_id, json.dumps(held).encode()) is not None
    storage.new_scratch(step_id)
    assert live.is_dir()
    leases.remove(step_id)

    storage.new_scratch(step_id)  # lease free and no write for longer than lease_ttl_s: stale
    assert not live.exists() and not job.exists()
    assert mine.is_dir()  # this process made it moments ago and holds no lease: it stays


def test_the_lease_holder_clears_every_other_scratch_of_its_step(root, tmp_path):
    storage = pod(root, tmp_path / "cache", lease_ttl_s=30.0)
    step_id = "writer-0123456789ab"
    killed = _foreign_scratch(storage, step_id, "1.bbbbbbbb")  # fresh: killed a moment ago
    discarded = storage.local_dir / SCRATCH / f"{step_id}.discarded.cccccccc"
    discarded.mkdir()
    other_step = _foreign_scratch(storage, "other-0123456789ab", "1.dddddddd")
    _old(other_step, 3600)
    lease = storage.lease(step_id)
    assert lease.try_acquire()  # the runner makes scratch under the step's lease
    try:
        mine = storage.new_scratch(step_id)
    finally:
        lease.release()
    assert not killed.exists() and mine.is_dir()
    assert discarded.is_dir() and other_step.is_dir()  # forced-aside copies and other steps: untouched
