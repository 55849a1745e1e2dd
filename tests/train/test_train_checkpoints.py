"""Checkpointer: async saves with manifests, retention (newest K + permanent every M),
skipping corrupted or unfinished checkpoints, refusing a checkpoint of another shape;
uncompressed saves restoring bit for bit in both layouts (tree, and the packed layout of
host-state saves taken entirely in the background thread), older compressed ones too."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.integrity.hashing import build_manifest
from tidal.train.checkpoints import Checkpointer, CheckpointMismatch, CheckpointSaveFailed
from tidal.train.mirror import retained
from tidal.train.packing import pack_state, split_packed
from tidal.train.tree_hash import tree_sha256


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
    # a permanent checkpoint's manifest names its parameters' hash (MLflow's logged model is tagged with it)
    manifests = {n: json.loads((tmp_path / "checkpoint_manifests" / f"{n}.json").read_text()) for n in (3, 6, 7)}
    assert manifests[3]["params_sha256"] == tree_sha256(state(3)["params"])
    assert manifests[6]["params_sha256"] == tree_sha256(state(6)["params"]) != manifests[3]["params_sha256"]
    assert "params_sha256" not in manifests[7]
    ckpt.close()


@pytest.mark.parametrize(("keep", "permanent_every", "first", "then", "left"), [
    (1, 2, (2, 3), (4,), [2, 4]), (3, None, (1, 2, 3), (4,), [2, 3, 4]), (1, 2, (2, 3), (4, 5, 6), [2, 4, 6])])
def test_retention_after_a_resume_keeps_what_the_earlier_process_kept(tmp_path, keep, permanent_every, first,
                                                                      then, left):
    """Issue 43, item 1, on a local root (the bucket: tests/storage/test_checkpoints_in_bucket.py)."""
    ckpt = Checkpointer(tmp_path, keep=keep, permanent_every=permanent_every)
    for step in first:
        ckpt.save(step, state(step))
    ckpt.close()
    fresh = Checkpointer(tmp_path, keep=keep, permanent_every=permanent_every)  # a fresh process resuming
    assert fresh.restore_latest(state(0))[0] == first[-1]
    for step in then:
        fresh.save(step, state(step))
    fresh.wait()
    assert fresh.steps() == left
    assert sorted(int(p.stem) for p in (tmp_path / "checkpoint_manifests").iterdir()) == left
    fresh.close()


def test_retained_is_newest_k_and_the_permanent_ones():
    assert retained({2000, 3000, 4000}, 1, 2000) == {2000, 4000}
    assert retained([1, 2, 3, 4], 3, None) == {2, 3, 4}
    assert retained([], 2, 5) == set()


@pytest.mark.parametrize("host_state", [False, True], ids=["tree", "packed"])
def test_corrupted_and_unfinished_checkpoints_are_skipped(tmp_path, caplog, host_state):
    ckpt = Checkpointer(tmp_path, keep=5, host_state=host_state)
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
@pytest.mark.parametrize("host_state", [False, True], ids=["tree", "packed"])
def test_restoring_into_another_shape_raises(tmp_path, other, message, host_state):
    ckpt = Checkpointer(tmp_path, keep=2, host_state=host_state)
    ckpt.save(1, state(1))
    ckpt.wait()
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), other)
    with pytest.raises(CheckpointMismatch, match="does not fit the model") as info:
        ckpt.restore_latest(abstract)
    assert message in str(info.value)
    assert ckpt.steps() == [1]  # the checkpoint stays: it is valid, just not for this model
    ckpt.close()


def special_state() -> dict:
    """Incompressible and compressible leaves, odd float bit patterns, several dtypes."""
    noise = np.random.default_rng(3).standard_normal((256, 257)).astype(np.float32)
    noise.ravel()[:6] = [np.nan, -np.nan, np.inf, -np.inf, -0.0, np.float32(1e-45)]  # NaNs, -0, subnormal
    payload_nan = np.array([0x7FC00001, 0xFFC12345], np.uint32).view(np.float32)  # NaNs with payloads
    return {"params": {"noise": jnp.asarray(noise), "nan_payloads": jnp.asarray(payload_nan),
                       "zeros": jnp.zeros((512, 512), jnp.float32),
                       "half": jnp.asarray(noise[:8]).astype(jnp.bfloat16)},
            "opt_state": {"count": jnp.int32(7), "ids": jnp.arange(10, dtype=jnp.int32)}}


def leaf_bytes(tree: dict) -> dict:
    return {path: (str(leaf.dtype), np.asarray(leaf).tobytes())
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("host_state", [False, True], ids=["tree", "packed"])
def test_uncompressed_checkpoint_restores_bitwise(tmp_path, host_state):
    want = special_state()
    ckpt = Checkpointer(tmp_path, keep=2, host_state=host_state)
    ckpt.save(1, want)
    manifest = ckpt.wait()
    # stored uncompressed: the 1 MiB of zeros alone would shrink to a few bytes under zstd
    raw = sum(leaf.nbytes for leaf in jax.tree.leaves(want))
    assert manifest["total_bytes"] >= raw
    saved = ckpt.manager.item_metadata(1)
    if host_state:  # one array per dtype, the leaf list in the orbax metadata
        assert sorted(saved.tree["packed"]) == ["bfloat16", "float32", "int32"]
        assert ["params/half", [8, 257], "bfloat16"] in saved.custom_metadata["tidal_packed"]
    else:
        assert sorted(saved.tree["params"]) == ["half", "nan_payloads", "noise", "zeros"]
    ckpt.close()
    ckpt = Checkpointer(tmp_path, keep=2, host_state=not host_state)  # either kind of run restores either
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), want)
    step, got, _ = ckpt.restore_latest(abstract)
    assert step == 1 and leaf_bytes(got) == leaf_bytes(want)  # every bit, NaN payloads included
    ckpt.close()


def test_host_state_save_returns_before_orbax_and_reports_its_errors(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, host_state=True)
    assert ckpt.host_state
    ckpt.save(1, state(1))
    ckpt.wait()
    (step, blocking, written), = ckpt.save_seconds
    assert step == 1 and blocking < written
    assert ckpt.problems(1) == []
    ckpt.save(2, {})  # returns: orbax's refusal of an empty tree happens in the worker thread ...
    with pytest.raises(CheckpointSaveFailed, match="checkpoint of step 2 .*empty item") as caught:
        ckpt.wait()  # ... and reaches the caller here, naming the checkpoint and the cause
    assert isinstance(caught.value.__cause__, ValueError)
    assert ckpt.steps() == [1]
    ckpt.close()
    sync = Checkpointer(tmp_path / "sync", keep=1, async_save=False, host_state=True)
    assert not sync.host_state  # nothing to overlap with a synchronous save
    sync.close()


def test_compressed_checkpoint_of_earlier_versions_still_restores(tmp_path):
    """Checkpoints written before the switch to uncompressed saves (orbax StandardCheckpointHandler,
    zstd) keep loading: each array's zarr metadata names its compressor."""
    import orbax.checkpoint as ocp

    want = special_state()
    old = ocp.CheckpointManager(tmp_path / "checkpoints", options=ocp.CheckpointManagerOptions(create=True),
                                item_handlers=ocp.StandardCheckpointHandler())
    old.save(5, args=ocp.args.StandardSave(want))
    old.wait_until_finished()
    old.close()
    compressed = build_manifest(tmp_path / "checkpoints" / "5")
    assert compressed["total_bytes"] < sum(leaf.nbytes for leaf in jax.tree.leaves(want)) - 2**20  # zeros shrank
    (tmp_path / "checkpoint_manifests").mkdir()
    (tmp_path / "checkpoint_manifests" / "5.json").write_text(json.dumps({**compressed, "step": 5}))
    ckpt = Checkpointer(tmp_path, keep=2)
    step, got, _ = ckpt.restore_latest(want)
    assert step == 5 and leaf_bytes(got) == leaf_bytes(want)
    ckpt.close()


def test_states_that_cannot_be_packed_are_saved_as_a_tree(tmp_path):
    keyed = {"params": {"w": jnp.ones((2, 2))}, "opt_state": {"rng": jax.random.key(1)}}
    assert pack_state(keyed) is None  # typed PRNG keys have no plain bytes to concatenate
    assert pack_state(state(1), max_bytes=16) is None and pack_state(state(1), max_bytes=64) is not None
    assert pack_state({}) is None
    item, meta = pack_state(state(2))
    with pytest.raises(ValueError, match="more than its 1 listed leaves"):
        split_packed(item["packed"], meta["tidal_packed"][:1])  # a leaf list that does not fit is refused
    ckpt = Checkpointer(tmp_path, keep=1, host_state=True)
    ckpt.save(1, keyed)
    ckpt.wait()
    assert sorted(ckpt.manager.item_metadata(1).tree) == ["opt_state", "params"]
    ckpt.close()


RESHARD = """
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tidal.train.checkpoints import Checkpointer
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
rng = np.random.default_rng(0)
host = {"params": {"w": rng.standard_normal((8, 6)).astype(np.float32), "b": np.arange(6, dtype=np.int32)},
        "opt_state": {"mu": rng.standard_normal((8, 6)).astype(np.float32)}}
put = lambda tree, specs: jax.tree.map(lambda a, p: jax.device_put(a, NamedSharding(mesh, p)), tree, specs)
saved = put(host, {"params": {"w": P("a", "b"), "b": P()}, "opt_state": {"mu": P(None, "a")}})
ckpt = Checkpointer(sys.argv[1], keep=1, host_state=True)
ckpt.save(1, saved)
ckpt.wait()
want = {"params": {"w": P("b", None), "b": P("a")}, "opt_state": {"mu": P("a", "b")}}
abstract = jax.tree.map(lambda a, p: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, p)),
                        host, want)
step, got, _ = ckpt.restore_latest(abstract)
layout = sorted(ckpt.manager.item_metadata(1).tree)
ckpt.close()
leaves = lambda tree: jax.tree.leaves(tree)
print(json.dumps({"step": step, "packed": layout,
                  "same": all(np.array_equal(np.asarray(g), h) for g, h in zip(leaves(got), leaves(host))),
                  "shardings": all(g.sharding == a.sharding for g, a in zip(leaves(got), leaves(abstract)))}))
"""


def test_packed_checkpoint_restores_into_another_sharding(tmp_path):
    """A packed save of arrays sharded over 4 devices restores, value for value, into other shardings."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", RESHARD, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"step": 1, "packed": ["packed"], "same": True,
                                                                "shardings": True}
