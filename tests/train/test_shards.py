"""Sharded checkpoints (tidal/train/shards.py) in one process on a local root: the objects are the shards'
raw bytes with the sizes and sha256 the manifest records, an all-zero leaf is written, a local copy
verifies like an orbax checkpoint, a missing object or a missing manifest is seen, and a state of another
layout is refused. The multi-process runs are in tests/train/test_sharded_checkpoints.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.integrity.hashing import verify_manifest
from tidal.train import shard_arrays, shards
from tidal.train.checkpoints import Checkpointer, CheckpointMismatch
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR


def state() -> dict:
    return {"params": {"w": jnp.arange(24, dtype=jnp.float32).reshape(6, 4) / 7,
                       "b": jnp.zeros((4,), jnp.bfloat16)},
            "opt_state": [jnp.full((6, 4), 0.5, jnp.float32), jnp.int32(9)]}


def save(location: Path, step: int, tree: dict) -> dict:
    host = shard_arrays.copy_to_host(tree)
    shards.write_shards(str(location), step, host, process=0, create_metadata=True)
    return shards.commit(str(location), step, host, processes=1, extra={"fingerprint": {"x": 1}})


def test_each_object_is_its_shards_bytes_and_the_manifest_names_them(tmp_path):
    saved = state()
    manifest = save(tmp_path, 5, saved)
    base = tmp_path / CHECKPOINT_DIR / "5"
    on_disk = {p.relative_to(base).as_posix(): p.read_bytes() for p in base.rglob("*") if p.is_file()}
    assert {f["path"] for f in manifest["files"]} == set(on_disk)
    for entry in manifest["files"]:
        data = on_disk[entry["path"]]
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"]), entry["path"]
    # the zero leaf is an object of its zeros (not elided as zarr's fill value), the scalar one of 4 bytes
    assert on_disk["params.b/0"] == bytes(8) and len(on_disk["opt_state.1/0"]) == 4
    assert on_disk["params.w/0.0"] == np.asarray(saved["params"]["w"]).astype("<f4").tobytes()
    assert manifest["leaves"] == [["opt_state.0", [6, 4], "float32", [6, 4]], ["opt_state.1", [], "int32", []],
                                  ["params.b", [4], "bfloat16", [4]], ["params.w", [6, 4], "float32", [6, 4]]]
    assert manifest["fingerprint"] == {"x": 1} and "_shards/0.json" in on_disk
    assert verify_manifest(base, manifest) == []  # a local copy checks as an orbax one does
    assert json.loads((tmp_path / MANIFEST_DIR / "5.json").read_text()) == manifest
    assert shards.problems(str(tmp_path), manifest) == []


def test_a_shard_larger_than_the_chunk_limit_is_split_into_objects_of_at_most_it(tmp_path):
    assert shard_arrays.chunk_shape((6, 4), 4, target_bytes=32) == (3, 2)  # 96 B: the longest axis first
    assert shard_arrays.chunk_shape((7,), 4, target_bytes=8) == (1,) and shard_arrays.chunk_shape((), 4, 1) == ()
    saved = state()
    host = shard_arrays.copy_to_host(saved, chunk_bytes=32)
    shards.write_shards(str(tmp_path), 3, host, process=0, create_metadata=True)
    manifest = shards.commit(str(tmp_path), 3, host, processes=1)
    names = sorted(f["path"] for f in manifest["files"] if f["path"].startswith("params.w/"))
    assert names == ["params.w/.zarray", "params.w/0.0", "params.w/0.1", "params.w/1.0", "params.w/1.1"]
    assert all(f["bytes"] <= 32 for f in manifest["files"] if not f["path"].endswith((".zarray", ".json")))
    got = shards.restore(str(tmp_path), manifest, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), saved))
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(got), strict=True))


def test_a_restore_gives_the_state_back_bitwise_as_arrays_or_host_arrays(tmp_path):
    saved = state()
    manifest = save(tmp_path, 5, saved)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), saved)
    for target in (abstract, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), saved)):
        got = shards.restore(str(tmp_path), manifest, target)
        assert jax.tree.structure(got) == jax.tree.structure(saved)
        for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(got), strict=True):
            assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))


def test_a_missing_object_and_a_missing_manifest_are_seen(tmp_path):
    manifest = save(tmp_path, 5, state())
    (tmp_path / CHECKPOINT_DIR / "5" / "params.w" / "0.0").unlink()
    assert shards.problems(str(tmp_path), manifest) == ["params.w/0.0: missing"]
    host = shard_arrays.copy_to_host(state())
    shards.write_shards(str(tmp_path), 7, host, process=0, create_metadata=True)  # killed before the commit
    assert shards.uncounted(str(tmp_path)) == [7] and shards.read_manifest(str(tmp_path), 7) is None


def test_a_state_of_another_layout_is_refused_naming_the_leaf(tmp_path):
    manifest = save(tmp_path, 5, state())
    other = state()
    other["params"]["w"] = jnp.zeros((6, 5), jnp.float32)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), other)
    with pytest.raises(ValueError, match=r"params.w: checkpoint float32\[6, 4\] vs model float32\[6, 5\]"):
        shards.restore(str(tmp_path), manifest, abstract)


def test_a_committed_sharded_checkpoint_restores_through_the_checkpointer(tmp_path):
    """What `tidal export` / `sample` do with a multi-process run's committed step: its checkpoints/ and
    checkpoint_manifests/ materialized locally, read by the Checkpointer as any checkpoint."""
    saved = state()
    save(tmp_path, 5, saved)
    ckpt = Checkpointer(tmp_path, keep=1, async_save=False, primary=False)
    try:
        assert ckpt.steps() == [5] and ckpt.problems(5) == []
        got, manifest = ckpt.restore(5, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), saved))
        assert manifest["format"] == shards.FORMAT
        assert all(np.array_equal(np.asarray(a), np.asarray(b))
                   for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(got), strict=True))
        other = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), {"params": saved["params"]})
        with pytest.raises(CheckpointMismatch, match="opt_state.0: in checkpoint, not in model"):
            ckpt.restore(5, other)
    finally:
        ckpt.close()


def test_every_chunk_read_is_checked_against_the_manifest(tmp_path):
    """A restore hashes each whole chunk it reads: a chunk overwritten with bytes of the same size (which a
    listing cannot see) is refused, naming it; the other leaves and an intact copy read back bitwise."""
    saved = state()
    host = shard_arrays.copy_to_host(saved, chunk_bytes=32)  # w (6x4 float32, 96 bytes) in 4 chunks of 3x2
    shards.write_shards(str(tmp_path), 5, host, process=0, create_metadata=True)
    manifest = shards.commit(str(tmp_path), 5, host, processes=1)
    keys = sorted(f["path"] for f in manifest["files"]
                  if f["path"].startswith("params.w/") and "zarray" not in f["path"])
    assert keys == ["params.w/0.0", "params.w/0.1", "params.w/1.0", "params.w/1.1"], keys
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), saved)
    got = shards.restore(str(tmp_path), manifest, abstract)
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(got), strict=True))
    victim = tmp_path / CHECKPOINT_DIR / "5" / "params.w" / "1.0"
    victim.write_bytes(bytes(len(victim.read_bytes())))
    assert shards.problems(str(tmp_path), manifest) == []  # the sizes match: only reading the bytes tells
    with pytest.raises(shard_arrays.CorruptChunk, match=r"params\.w/1\.0 does not match its manifest's sha256"):
        shards.restore(str(tmp_path), manifest, abstract)


def test_kvstore_specs_follow_the_storage_settings(monkeypatch):
    monkeypatch.setenv("TIDAL_S3_ENDPOINT_URL", "http://10.0.0.1:9000/")
    assert shard_arrays.kvstore("s3://b/a/c") == {"driver": "s3", "bucket": "b", "path": "a/c/",
                                                  "aws_region": "us-east-1", "endpoint": "http://10.0.0.1:9000"}
    # an S3 server standing in for a gs:// bucket takes its arrays too (one store for arrays and manifest),
    # signed for region "auto" as GCS's own XML API wants
    assert shard_arrays.kvstore("gs://b/x") == {"driver": "s3", "bucket": "b", "path": "x/",
                                                "aws_region": "auto", "endpoint": "http://10.0.0.1:9000"}
    monkeypatch.delenv("TIDAL_S3_ENDPOINT_URL")
    assert shard_arrays.kvstore("gs://b/x") == {"driver": "gcs", "bucket": "b", "path": "x/"}
    assert shard_arrays.kvstore("/tmp/x") == {"driver": "file", "path": "/tmp/x/"}
    with pytest.raises(ValueError, match="needs a local path, s3:// or gs://"):
        shard_arrays.kvstore("hdfs://x/y")
