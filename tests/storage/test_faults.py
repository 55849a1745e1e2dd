"""Injected faults against a real S3 server: errors, dropped connections, a worker killed before the marker.

After each: no committed step misses data (every manifest entry is there with its size and
downloads to its sha256), no half-written step counts as committed, and the rerun completes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from botocore.exceptions import ConnectionClosedError

from tests.conftest import REPO
from tests.storage.test_s3_storage import assert_complete, objects, raw_client
from tidal.core.runner import StepBlocked, run_step
from tidal.steps import Step
from tidal.storage import StorageSettings, open_storage
from tidal.storage.s3 import HOLD_BEFORE_MARKER_ENV

LEASE_TTL_S = 8.0
WRITER = {"name": "writer", "kind": "fixture", "config": {"parts": 8, "pause_s": 0.0, "fail_at": None}}


def step_of(spec: dict) -> Step:
    return Step(spec["name"], spec["kind"], spec["config"])


def test_500_and_503_slowdown_are_retried(bucket, proxy):
    proxy.plan.every = 5  # every 5th request fails, alternating 500 InternalError / 503 SlowDown
    storage = open_storage(f"s3://{bucket}/e", settings=StorageSettings(max_attempts=8))
    upstream = step_of(WRITER)
    reader = Step("reader", "concat", {}, inputs=(upstream,))
    assert run_step(upstream, storage).status == "run"
    assert run_step(reader, storage).status == "run"
    assert proxy.plan.injected.get(500, 0) >= 3 and proxy.plan.injected.get(503, 0) >= 3
    proxy.plan.every = 0
    for step in (upstream, reader):
        assert_complete(storage, step.step_id)


def test_errors_past_the_retry_budget_leave_nothing_committed(bucket, proxy):
    # half of all requests fail with 500 (not 503: adaptive mode would throttle this client to ~1 request/s)
    proxy.plan.every, proxy.plan.statuses = 2, (500,)
    storage = open_storage(f"s3://{bucket}/x", settings=StorageSettings(max_attempts=1))
    step = step_of(WRITER)
    with pytest.raises(Exception, match="InternalError"):
        run_step(step, storage)
    proxy.plan.every = 0
    assert not storage.is_committed(step.step_id)
    # the task's retry: a new worker (adaptive mode's slowed rate is per client)
    rerun = open_storage(f"s3://{bucket}/x")
    assert run_step(step, rerun).status == "run"
    assert_complete(rerun, step.step_id)


def test_connection_dropped_mid_upload(bucket, proxy):
    settings = StorageSettings(multipart_threshold_bytes=5 << 20, multipart_chunk_bytes=5 << 20)
    proxy.plan.drop_uploads, proxy.plan.drop_min_bytes = 2, 1 << 20
    storage = open_storage(f"s3://{bucket}/d", settings=settings)
    step = Step("blob", "blob", {"mib": 11})
    assert run_step(step, storage).status == "run"  # botocore retried the dropped part uploads
    assert proxy.plan.dropped == 2
    assert_complete(storage, step.step_id)


def test_dropped_upload_past_the_retry_budget_commits_nothing_and_rerun_completes(bucket, proxy):
    proxy.plan.drop_uploads, proxy.plan.drop_min_bytes = 10, 1 << 20  # more drops than any layer retries
    storage = open_storage(f"s3://{bucket}/n", settings=StorageSettings(max_attempts=1))
    step = Step("blob", "blob", {"mib": 3})
    with pytest.raises(ConnectionClosedError):
        run_step(step, storage)
    proxy.plan.drop_uploads = proxy.plan.dropped  # the network heals
    assert proxy.plan.dropped >= 1 and not storage.is_committed(step.step_id)
    assert run_step(step, storage).status == "run"
    assert_complete(storage, step.step_id)


def test_worker_killed_between_data_and_marker(bucket, s3_env, tmp_path):
    root = f"s3://{bucket}/k"
    flag = tmp_path / "data-uploaded"
    # a short lease TTL: the killed worker's lease blocks the step until it expires (120 s by default)
    spec = {"root": root, "step": WRITER, "out": str(tmp_path / "out.json"), "settings": {"lease_ttl_s": LEASE_TTL_S}}
    env = {**os.environ, "PYTHONPATH": str(REPO), HOLD_BEFORE_MARKER_ENV: str(flag)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.storage.worker", json.dumps(spec)], cwd=REPO, env=env)
    deadline = time.monotonic() + 90
    while not flag.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the worker never reached the marker (exit {proc.poll()})")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    storage = open_storage(root, settings=StorageSettings(lease_ttl_s=LEASE_TTL_S))
    step = step_of(WRITER)
    half = objects(raw_client(s3_env.endpoint), bucket, f"k/{step.step_id}/")
    assert len(half) == 10 and f"k/{step.step_id}/_SUCCESS" not in half  # 8 parts, manifest, step.json
    assert not storage.is_committed(step.step_id)
    with pytest.raises(StepBlocked):
        run_step(Step("reader", "concat", {}, inputs=(step,)), storage)
    started = time.monotonic()
    result = run_step(step, storage)  # the dead worker's lease is taken over once it expired, not before
    assert LEASE_TTL_S / 4 < time.monotonic() - started < LEASE_TTL_S * 4
    assert result.status == "run"
    lease = json.loads(storage.read_text(step.step_id, "step.json"))["provenance"]["lease"]
    assert lease["took_over_from"].split(":")[1] == str(proc.pid)
    assert_complete(storage, step.step_id)
