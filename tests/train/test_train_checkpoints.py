"""Checkpointer: async saves with manifests, retention (newest K + permanent every M),
skipping corrupted or unfinished checkpoints, refusing a checkpoint of another shape."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.hashing import build_manifest
from tidal.train.checkpoints import Checkpointer, CheckpointMismatch


def state(value: float, rows: int = 4) -> dict:
    return {"params": {"w": jnp.full((rows, 3), value, jnp.float32)}, "opt_state": {"count": jnp.int32(value)}}


def test_save_writes_manifests_and_prunes(tmp_path):
    seen = []
    ckpt = Checkpointer(tmp_path, keep=2, on_manifest=seen.append)
    for step in (1, 2, 3):
        ckpt.save(step, state(step), fingerprint={"python": "3.x"})
    manifest = ckpt.wait()
    assert ckpt.steps() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoint_manifests").iterdir()) == ["2.json", "3.json"]
    latest = json.loads((tmp_path / "checkpoint_manifest.json").read_text())
    assert latest == manifest and latest["step"] == 3 and latest["fingerprint"] == {"python": "3.x"}
    assert latest["root_hash"] == build_manifest(tmp_path / "checkpoints" / "3")["root_hash"]
    assert [m["step"] for m in seen] == [1, 2, 3]  # the callback got each manifest once written
    step, restored, _ = ckpt.restore_latest(state(0))
    assert step == 3 and np.array_equal(restored["params"]["w"], np.full((4, 3), 3.0, np.float32))
    ckpt.close()


def test_async_save_manifest_covers_the_finished_files(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    noise = jax.random.normal(jax.random.key(0), (512, 1024), jnp.float32)  # incompressible
    big = {"params": {"w": noise}, "opt_state": {"count": jnp.int32(1)}}
    ckpt.save(1, big)
    manifest = ckpt.wait()
    assert manifest["step"] == 1 and (tmp_path / "checkpoint_manifests" / "1.json").is_file()
    assert manifest["total_bytes"] > 512 * 1024 * 4 * 0.9  # the 2 MiB array is in the hashed files
    assert ckpt.save_seconds and ckpt.save_seconds[0][0] == 1
    ckpt.close()


def test_permanent_checkpoints_outlive_the_newest_k(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, permanent_every=3)
    for step in range(1, 9):
        ckpt.save(step, state(step))
    ckpt.wait()
    assert ckpt.steps() == [3, 6, 7, 8]
    assert sorted(int(p.stem) for p in (tmp_path / "checkpoint_manifests").iterdir()) == [3, 6, 7, 8]
    ckpt.close()


def test_corrupted_and_unfinished_checkpoints_are_skipped(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, keep=5)
    for step in (1, 2, 3):
        ckpt.save(step, state(step))
    ckpt.close()
    (tmp_path / "checkpoint_manifests" / "3.json").unlink()  # save cut short before its manifest
    files = [p for p in (tmp_path / "checkpoints" / "2").rglob("*") if p.is_file()]
    victim = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))

    ckpt = Checkpointer(tmp_path, keep=5, log=logging.getLogger("test.ckpt"))
    with caplog.at_level(logging.WARNING, logger="test.ckpt"):
        step, restored, manifest = ckpt.restore_latest(state(0))
    assert step == 1 and manifest["step"] == 1
    assert float(restored["params"]["w"][0, 0]) == 1.0
    assert "no manifest" in caplog.text and "sha256 differs" in caplog.text
    assert ckpt.steps() == [1]  # rejected newer checkpoints are deleted, so steps 2, 3 can be redone
    assert json.loads((tmp_path / "checkpoint_manifest.json").read_text())["step"] == 1
    ckpt.save(2, state(2.5))
    ckpt.wait()
    assert ckpt.steps() == [1, 2]
    ckpt.close()


def test_no_valid_checkpoint_means_fresh_start(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=1)
    assert ckpt.restore_latest(state(0)) is None
    ckpt.save(4, state(4))
    ckpt.wait()
    (tmp_path / "checkpoint_manifests" / "4.json").write_text("{not json")
    assert ckpt.restore_latest(state(0)) is None
    assert ckpt.steps() == [] and not (tmp_path / "checkpoint_manifest.json").exists()
    ckpt.close()


@pytest.mark.parametrize("other, message", [
    (state(0, rows=5), "params/w: checkpoint float32[4, 3] vs model float32[5, 3]"),
    ({"params": {"w": jnp.zeros((4, 3), jnp.bfloat16)}, "opt_state": {"count": jnp.int32(0)}},
     "params/w: checkpoint float32[4, 3] vs model bfloat16[4, 3]"),
    ({"params": {"w": jnp.zeros((4, 3)), "v": jnp.zeros(2)}, "opt_state": {"count": jnp.int32(0)}},
     "params/v: in model, not in checkpoint"),
])
def test_restoring_into_another_shape_raises(tmp_path, other, message):
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(1, state(1))
    ckpt.wait()
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), other)
    with pytest.raises(CheckpointMismatch, match="does not fit the model") as info:
        ckpt.restore_latest(abstract)
    assert message in str(info.value)
    assert ckpt.steps() == [1]  # the checkpoint stays: it is valid, just not for this model
    ckpt.close()
