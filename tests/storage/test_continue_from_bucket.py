"""A continued run on an object-store root (tidal/train/continuation.py): the parent's checkpoint is
downloaded from the parent step's prefix in the bucket (a real S3 server on loopback), verified
against its manifest and the planned root hash, and restores bit for bit; another root hash is
refused and nothing is left behind."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tidal.train.checkpoints import Checkpointer
from tidal.train.config import ConfigError, ResolvedContinue
from tidal.train.continuation import adopt_parent_checkpoint


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
