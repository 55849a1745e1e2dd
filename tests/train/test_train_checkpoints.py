"""Checkpointer: manifests, pruning, skipping corrupted or unfinished checkpoints."""

from __future__ import annotations

import json
import logging

import jax.numpy as jnp
import numpy as np

from tidal.hashing import build_manifest
from tidal.train.checkpoints import Checkpointer


def state(value: float) -> dict:
    return {"params": {"w": jnp.full((4, 3), value, jnp.float32)}, "opt_state": {"count": jnp.int32(value)}}


def test_save_writes_manifests_and_prunes(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        manifest = ckpt.save(step, state(step))
    assert ckpt.steps() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoint_manifests").iterdir()) == ["2.json", "3.json"]
    latest = json.loads((tmp_path / "checkpoint_manifest.json").read_text())
    assert latest == manifest and latest["step"] == 3
    assert latest["root_hash"] == build_manifest(tmp_path / "checkpoints" / "3")["root_hash"]
    step, restored, _ = ckpt.restore_latest(state(0))
    assert step == 3 and np.array_equal(restored["params"]["w"], np.full((4, 3), 3.0, np.float32))
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
    assert ckpt.steps() == [1, 2]
    ckpt.close()


def test_no_valid_checkpoint_means_fresh_start(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=1)
    assert ckpt.restore_latest(state(0)) is None
    ckpt.save(4, state(4))
    (tmp_path / "checkpoint_manifests" / "4.json").write_text("{not json")
    assert ckpt.restore_latest(state(0)) is None
    assert ckpt.steps() == [] and not (tmp_path / "checkpoint_manifest.json").exists()
    ckpt.close()
