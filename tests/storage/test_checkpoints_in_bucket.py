"""Checkpoints in the bucket (tidal/train/mirror.py) on a real S3 server on loopback: each counts once
its manifest is uploaded, retention applies there, a fresh process on an empty disk restores the
newest one that verifies (bit for bit), a corrupted one is skipped with a WARNING and removed, and
a save the bucket refuses is reported at the next check, naming the checkpoint, with the earlier
checkpoint still restorable."""

from __future__ import annotations

import logging
import time

import boto3
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.train.checkpoints import Checkpointer, CheckpointSaveFailed


def state(value: float) -> dict:
    return {"params": {"w": jnp.full((64, 32), value, jnp.float32)}, "opt_state": {"count": jnp.int32(value)}}


def keys(client, bucket: str, prefix: str) -> list[str]:
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix):] for o in listing)


@pytest.fixture
def s3(s3_env):
    return boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1")


@pytest.mark.parametrize("host_state", [False, True])
def test_checkpoints_count_in_the_bucket_and_restore_on_an_empty_disk(tmp_path, bucket, s3, host_state):
    mirror = f"s3://{bucket}/root/.staging/train-abc/"
    ckpt = Checkpointer(tmp_path / "node-a", keep=2, mirror=mirror, host_state=host_state)
    for step in (10, 20, 30):
        ckpt.save(step, state(step), sidecars={"metrics.jsonl": f"step {step}\n".encode()})
    ckpt.close()
    names = keys(s3, bucket, "root/.staging/train-abc/")
    assert [n for n in names if n.startswith("checkpoint_manifests/")] == [
        "checkpoint_manifests/20.json", "checkpoint_manifests/30.json"]  # keep=2, in the bucket too
    assert not any(n.startswith("checkpoints/10/") for n in names)
    assert any(n.startswith("checkpoints/30/") for n in names)
    assert s3.get_object(Bucket=bucket, Key="root/.staging/train-abc/metrics.jsonl")["Body"].read() == b"step 30\n"

    fresh = Checkpointer(tmp_path / "node-b", keep=2, mirror=mirror, host_state=host_state)  # an empty disk
    step, restored, manifest = fresh.restore_latest(state(0))
    fresh.close()
    assert step == 30 and manifest["step"] == 30
    assert np.array_equal(np.asarray(restored["params"]["w"]), np.full((64, 32), 30.0, np.float32))
    assert int(restored["opt_state"]["count"]) == 30


def test_a_corrupted_checkpoint_in_the_bucket_is_skipped_and_removed(tmp_path, bucket, s3, caplog):
    mirror = f"s3://{bucket}/r/.staging/t/"
    ckpt = Checkpointer(tmp_path / "a", keep=3, mirror=mirror)
    for step in (1, 2):
        ckpt.save(step, state(step))
    ckpt.close()
    victim = "params.w/0.0"  # the one chunk of a leaf (tidal.train.shards' layout)
    assert victim in keys(s3, bucket, "r/.staging/t/checkpoints/2/")
    body = s3.get_object(Bucket=bucket, Key=f"r/.staging/t/checkpoints/2/{victim}")["Body"].read()
    s3.put_object(Bucket=bucket, Key=f"r/.staging/t/checkpoints/2/{victim}", Body=bytes(len(body)))  # same size
    caplog.set_level(logging.WARNING, "tidal.train.checkpoints")
    fresh = Checkpointer(tmp_path / "b", keep=3, mirror=mirror)
    step, restored, _ = fresh.restore_latest(state(0))
    fresh.close()
    assert step == 1 and int(restored["opt_state"]["count"]) == 1
    assert any("failed verification" in r.getMessage() and "checkpoints/2" in r.getMessage() for r in caplog.records)
    assert keys(s3, bucket, "r/.staging/t/checkpoint_manifests/") == ["1.json"]


def test_a_save_the_bucket_refuses_stops_training_at_once_and_keeps_the_earlier_one(tmp_path, bucket, proxy):
    mirror = f"s3://{bucket}/r/.staging/t/"
    ckpt = Checkpointer(tmp_path / "a", keep=3, mirror=mirror)
    ckpt.save(1, state(1))
    ckpt.wait()
    proxy.plan.every, proxy.plan.statuses = 1, (403,)  # the bucket now refuses every request
    ckpt.save(2, state(2))
    start = time.monotonic()
    with pytest.raises(CheckpointSaveFailed, match=r"checkpoint of step 2 .*was not saved") as caught:
        while time.monotonic() - start < 30:
            ckpt.check()  # what the training loop calls after every step
            time.sleep(0.05)
    assert time.monotonic() - start < 30 and "earlier checkpoints are intact" in str(caught.value)
    ckpt.close()
    proxy.plan.every = 0
    fresh = Checkpointer(tmp_path / "b", keep=3, mirror=mirror)
    step, restored, _ = fresh.restore_latest(state(0))
    fresh.close()
    assert step == 1 and int(restored["opt_state"]["count"]) == 1


@pytest.mark.parametrize(("keep", "permanent_every", "first", "then", "left"), [
    (1, 2, (2, 3), (4,), [2, 4]),  # the permanent 2 outlives a resume (issue 43, item 1)
    (3, None, (1, 2, 3), (4,), [2, 3, 4]),  # the newest 3 across both processes, not 2
    (1, 2, (2, 3), (4, 5, 6), [2, 4, 6]),
], ids=["permanent", "newest-k", "several-saves"])
def test_retention_after_a_resume_on_an_empty_disk_keeps_what_the_earlier_process_kept(
        tmp_path, bucket, s3, keep, permanent_every, first, then, left):
    """A fresh process fetches only the newest checkpoint, so orbax there knows of no other one; the
    bucket's retention must still count the earlier process's checkpoints (newest ``keep`` of all, and
    every permanent one)."""
    mirror = f"s3://{bucket}/r/.staging/t/"
    ckpt = Checkpointer(tmp_path / "a", keep=keep, permanent_every=permanent_every, mirror=mirror)
    for step in first:
        ckpt.save(step, state(step))
    ckpt.close()
    fresh = Checkpointer(tmp_path / "b", keep=keep, permanent_every=permanent_every, mirror=mirror)
    assert fresh.restore_latest(state(0))[0] == first[-1]
    for step in then:
        fresh.save(step, state(step))
    fresh.close()
    assert keys(s3, bucket, "r/.staging/t/checkpoint_manifests/") == [f"{n}.json" for n in left]
    assert sorted({int(n.split("/")[0]) for n in keys(s3, bucket, "r/.staging/t/checkpoints/")}) == left
    again = Checkpointer(tmp_path / "c", keep=keep, permanent_every=permanent_every, mirror=mirror)
    assert again.restore_latest(state(0))[0] == left[-1]  # and each left one still restores
    again.close()
