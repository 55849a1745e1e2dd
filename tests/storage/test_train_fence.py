"""One trainer per train step across nodes (tidal/train/fence.py), on a real S3 server on loopback: a second
trainer started on a staged step exits 3 with one line naming the holder and touches nothing; a holder
that stalled past its lease's expiry is fenced: its next checkpoint upload fails and nothing of it is
written; a released lease lets the next trainer start at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import boto3
import jax.numpy as jnp
import pytest

from tidal.storage.lease import LeaseLost
from tidal.train.checkpoints import Checkpointer, CheckpointSaveFailed
from tidal.train.fence import EXIT_HELD, TrainingHeld, hold

STEP_ID = "train-0123456789abcdef"


def state(value: float) -> dict:
    return {"params": {"w": jnp.full((16, 8), value, jnp.float32)}, "opt_state": {"count": jnp.int32(value)}}


def listing(bucket: str, endpoint: str, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def test_a_second_trainer_exits_3_naming_the_holder_and_empties_nothing(bucket, s3_env, tmp_path):
    location = f"s3://{bucket}/root/.staging/{STEP_ID}/"
    first = hold(location, ttl_s=30)
    work = tmp_path / "cache" / ".resume" / STEP_ID  # the first trainer's work directory on this machine
    work.mkdir(parents=True)
    (work / "metrics.jsonl").write_text("step 1\n")
    env = {**os.environ, "TIDAL_TRAIN_LEASE_TTL_S": "2", "TIDAL_STORAGE_CACHE": str(tmp_path / "cache")}
    try:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "tidal.train", location], check=False, capture_output=True,
                              text=True, env=env, timeout=120)
        waited = time.monotonic() - start
    finally:
        first.release()
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == EXIT_HELD, proc.stderr[-2000:]
    assert len(errors) == 1 and first.owner in errors[0] and STEP_ID in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert waited >= 3  # it waited 1.5 x the ttl for the holder before giving up
    assert (work / "metrics.jsonl").read_text() == "step 1\n"  # the holder's work directory is untouched
    following = hold(location, ttl_s=30, wait_s=0)  # released: the next one starts at once
    assert following.owner != first.owner
    following.release()


def test_a_stalled_holder_is_fenced_at_its_next_checkpoint_upload(bucket, s3_env, tmp_path):
    location = f"s3://{bucket}/root/.staging/{STEP_ID}/"
    stalled = hold(location, ttl_s=5)
    stalled.lease._stop.set()  # its heartbeat stops, as in a process paused past its lease's expiry
    with pytest.raises(TrainingHeld, match=stalled.owner):  # live: a second one is refused, the holder named
        hold(location, ttl_s=5, wait_s=0)
    ckpt = Checkpointer(tmp_path / "node-a", keep=3, mirror=location, fence=stalled.check)
    ckpt.save(10, state(10))
    ckpt.wait()  # still its step: checkpoint 10 counts
    other = hold(location, ttl_s=30, wait_s=30)  # waits for the stalled lease to expire, then takes it over
    try:
        ckpt.save(20, state(20))
        with pytest.raises(CheckpointSaveFailed, match="checkpoint of step 20") as failed:
            ckpt.wait()
        assert isinstance(failed.value.__cause__, LeaseLost)
        ckpt.close()
        keys = listing(bucket, s3_env.endpoint, f"root/.staging/{STEP_ID}/")
        assert any(k.endswith("checkpoint_manifests/10.json") for k in keys)
        mine = [k.split(f"/{STEP_ID}/", 1)[1] for k in keys]  # (object names hold hex digests: "/20" is no test)
        assert not [k for k in mine if k.startswith(("checkpoints/20/", "checkpoint_manifests/20."))], mine
        other.check()  # the new holder's lease is intact
    finally:
        other.release()


def test_a_step_directory_outside_staging_gets_its_lease_beside_it(bucket, s3_env):
    """A trainer started by hand on a bucket directory (a reference run) is fenced too: the lease lives
    under its parent's .leases/."""
    first = hold(f"s3://{bucket}/runs/reference/", ttl_s=30)
    try:
        with pytest.raises(TrainingHeld, match=first.owner):
            hold(f"s3://{bucket}/runs/reference", ttl_s=30, wait_s=0)
        assert any(k.endswith("runs/.leases/reference.train.json")
                   for k in listing(bucket, s3_env.endpoint, "runs/"))
    finally:
        first.release()
