"""A continued run on an object-store root (tidal/train/continuation.py): the parent's checkpoint is
downloaded from the parent step's prefix in the bucket (a real S3 server on loopback), verified
against its manifest and the planned root hash, and restores bit for bit; another root hash is
refused and nothing is left behind. A sharded parent checkpoint (every bucket run's) is copied inside
the bucket instead, and restored from there."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tidal.train.checkpoints import Checkpointer
from tidal.train.config import ConfigError, ResolvedContinue
from tidal.train.continuation import adopt_parent_checkpoint, adopt_parent_in_bucket


def state(value: float) -> dict:
    return {"params": {"w": jnp.full((64, 32), value, jnp.float32)}, "opt_state": {"count": jnp.int32(value)}}


def test_parent_checkpoint_comes_from_the_bucket(tmp_path, bucket):
    parent = f"s3://{bucket}/root/train-0123456789ab/"  # a committed train step keeps the mirror's layout
    saved = Checkpointer(tmp_path / "parent-node", keep=2, mirror=parent)
    saved.save(40, state(40))
    manifest = saved.wait()
    saved.close()
    ref = ResolvedContinue(step="train-0123456789ab", checkpoint_step=40, checkpoint_root_hash=manifest["root_hash"],
                           data_seed=1)
    here = tmp_path / "node"
    with pytest.raises(ConfigError, match="is not the planned"):
        adopt_parent_checkpoint(ref.model_copy(update={"checkpoint_root_hash": "0" * 64}), parent,
                                here / "checkpoints", here / "checkpoint_manifests")
    assert not (here / "checkpoints" / "40").exists()
    adopt_parent_checkpoint(ref, parent, here / "checkpoints", here / "checkpoint_manifests")
    ckpt = Checkpointer(here, keep=2)
    step, restored, _ = ckpt.restore_latest(state(0))
    ckpt.close()
    assert step == 40 and int(restored["opt_state"]["count"]) == 40
    assert np.array_equal(np.asarray(restored["params"]["w"]), np.full((64, 32), 40.0, np.float32))


def test_a_sharded_parent_checkpoint_is_copied_inside_the_bucket_and_never_touches_a_disk(tmp_path, bucket, s3_env):
    import boto3

    parent = f"s3://{bucket}/root/train-0123456789ab/"
    child = f"s3://{bucket}/root/.staging/train-fedcba987654/"
    saved = Checkpointer(tmp_path / "parent-node", keep=2, mirror=parent)
    saved.save(40, state(40))
    manifest = saved.wait()
    saved.close()
    assert manifest["format"] == "tidal-sharded-1"  # a bucket run's checkpoints are sharded, one process or many
    ref = ResolvedContinue(step="train-0123456789ab", checkpoint_step=40, checkpoint_root_hash=manifest["root_hash"],
                           data_seed=1)
    s3 = boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1")

    def keys(prefix: str) -> list[str]:
        return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))

    with pytest.raises(ConfigError, match="is not the planned"):
        adopt_parent_in_bucket(ref.model_copy(update={"checkpoint_root_hash": "0" * 64}), parent, child)
    assert keys("root/.staging/") == []
    assert adopt_parent_in_bucket(ref, parent, child)["root_hash"] == manifest["root_hash"]
    copied = [k.removeprefix("root/.staging/train-fedcba987654/") for k in keys("root/.staging/")]
    assert copied == [k.removeprefix("root/train-0123456789ab/") for k in keys("root/train-0123456789ab/")]
    here = tmp_path / "node"
    ckpt = Checkpointer(here, keep=2, mirror=child)
    step, restored, _ = ckpt.restore_latest(state(0))
    ckpt.close()
    assert step == 40 and int(restored["opt_state"]["count"]) == 40
    assert np.array_equal(np.asarray(restored["params"]["w"]), np.full((64, 32), 40.0, np.float32))
    assert not [p for p in here.rglob("*") if p.is_file() and "checkpoints" in p.parts]  # no disk held it
