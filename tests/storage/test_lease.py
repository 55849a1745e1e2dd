"""Leases: two workers racing on one step never both commit; heartbeats, expiry and takeover."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tidal.core.runner import run_step
from tidal.steps import Step
from tidal.storage import LocalStorage, StorageSettings, open_storage
from tidal.storage.lease import Lease, LeaseLost, LeaseTimeout

SLOW = {"name": "writer", "kind": "fixture", "config": {"parts": 6, "pause_s": 0.25, "fail_at": None}}


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    """A storage root of each backend (the S3 one on the moto server)."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/lease"


def foreign(storage, step_id: str, ttl_s: float) -> Lease:
    """A lease held by a worker on another host (its pid cannot be probed from here)."""
    return Lease(storage.lease(step_id).store, step_id, ttl_s=ttl_s, owner="elsewhere:1:abcd")


def test_two_workers_race_one_commits(root, tmp_path):
    go, procs = tmp_path / "go", []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for i in range(2):
        spec = {"root": root, "step": SLOW, "go": str(go), "out": str(tmp_path / f"out{i}.json"),
                "settings": {"lease_ttl_s": 20.0, "lease_wait_s": 60.0}}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.storage.worker", json.dumps(spec)],
                                      cwd=REPO, env=env))
    time.sleep(3.0)  # both imported and polling for the go file
    go.write_text("go")
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert sorted(r["status"] for r in results) == ["run", "skip"]
    winner = next(r for r in results if r["status"] == "run")
    storage = open_storage(root)
    step = Step(SLOW["name"], SLOW["kind"], SLOW["config"])
    record = json.loads(storage.read_text(step.step_id, "step.json"))
    assert record["provenance"]["pid"] == winner["pid"]
    assert record["provenance"]["lease"]["owner"].split(":")[1] == str(winner["pid"])
    assert storage.lease(step.step_id).store.read(step.step_id) is None  # released after the commit


def test_live_foreign_lease_blocks_then_times_out(root):
    storage = open_storage(root, settings=StorageSettings(lease_wait_s=1.0))
    step = Step(SLOW["name"], SLOW["kind"], {**SLOW["config"], "parts": 1})
    holder = foreign(storage, step.step_id, ttl_s=60)
    assert holder.try_acquire()
    with pytest.raises(LeaseTimeout, match="elsewhere:1:abcd"):
        run_step(step, storage)
    assert not storage.is_committed(step.step_id)


def test_expired_foreign_lease_is_taken_over_and_recorded(root):
    storage = open_storage(root)
    step = Step(SLOW["name"], SLOW["kind"], {**SLOW["config"], "parts": 1})
    stale = foreign(storage, step.step_id, ttl_s=0.3)
    assert stale.try_acquire()  # no heartbeat thread: it expires
    time.sleep(0.5)
    assert run_step(step, storage).status == "run"
    lease = json.loads(storage.read_text(step.step_id, "step.json"))["provenance"]["lease"]
    assert lease["took_over_from"] == "elsewhere:1:abcd"
    with pytest.raises(LeaseLost):
        stale.ensure_held()  # the old holder cannot renew, so it would never publish


def test_heartbeat_keeps_a_lease_alive_past_its_ttl(root):
    storage = open_storage(root)
    holder = Lease(storage.lease("s-000000000000").store, "s-000000000000", ttl_s=0.6)
    assert holder.acquire(wait_s=0, done=lambda: False)
    time.sleep(1.5)  # 2.5 TTLs: only the heartbeats keep it
    rival = foreign(storage, "s-000000000000", ttl_s=0.6)
    assert not rival.try_acquire() and holder.renewals >= 3
    holder.ensure_held()
    holder.release()
    assert rival.try_acquire()  # released: free at once
    rival.release()


def test_a_lease_of_a_process_gone_on_this_host_is_held_until_it_expires(tmp_path):
    """No pid shortcut: a pod with its own PID namespace may name a live holder by a pid that is
    free here, so even an owner 'on this host' whose pid is not running is trusted until expiry."""
    storage = LocalStorage(tmp_path)
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True,
                          text=True)
    dead = Lease(storage.lease("s-111111111111").store, "s-111111111111", ttl_s=0.8,
                 owner=f"{socket.gethostname()}:{proc.stdout.strip()}:dead")
    assert dead.try_acquire()
    fresh = storage.lease("s-111111111111")
    assert not fresh.try_acquire()  # its pid is gone, but its lease has not expired
    time.sleep(1.0)
    assert fresh.try_acquire() and fresh.record()["took_over_from"] == dead.owner
    fresh.release()


def test_a_holder_whose_lease_was_taken_over_does_not_publish_and_recovers(root):
    """A foreign worker takes the lease mid-compute: the first holder's fence refuses to publish;
    it waits for the foreign lease to expire, takes it over and commits (once)."""
    import threading

    storage = open_storage(root)
    step = Step(SLOW["name"], SLOW["kind"], {**SLOW["config"], "parts": 4})
    store = storage.lease(step.step_id).store
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.update(result=run_step(step, storage)))
    worker.start()
    deadline = time.monotonic() + 30
    while (current := store.read(step.step_id)) is None:
        assert time.monotonic() < deadline, "the worker never took its lease"
        time.sleep(0.01)
    stolen = {"step_id": step.step_id, "owner": "elsewhere:1:thief", "expires_unix": time.time() + 1.5,
              "released": False}
    assert store.replace(step.step_id, json.dumps(stolen).encode(), current[1]) is not None
    worker.join(timeout=60)
    assert outcome["result"].status == "run" and storage.is_committed(step.step_id)
    lease = json.loads(storage.read_text(step.step_id, "step.json"))["provenance"]["lease"]
    assert lease["took_over_from"] == "elsewhere:1:thief"
    assert list((storage.local_dir / ".scratch").iterdir()) == []  # the fenced attempt's scratch is gone
