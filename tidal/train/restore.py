"""Restoring a :class:`tidal.train.checkpoints.Checkpointer`'s checkpoints: the newest one that verifies,
from the step's directory or its bucket mirror (fetched whole), or a multi-process run's sharded one read
in place (each process its own shards, any mesh).

Apart from checkpoints.py, which saves: the two halves share only the Checkpointer's directory, mirror
and manifests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tidal.storage import uris
from tidal.train import CHECKPOINT_MANIFEST as LATEST_MANIFEST
from tidal.train import distributed, shard_arrays, shards
from tidal.train.mirror import CHECKPOINT_DIR, write_json_atomic
from tidal.train.packing import PACKED_KEY, layout_problems, tree_layout, unpack_state

Checkpointer = Any  # tidal.train.checkpoints.Checkpointer, which imports this module


class CheckpointMismatch(ValueError):
    """A verified checkpoint does not fit the model being trained (tree, shape or dtype differ)."""


def restore_latest(ckpt: Checkpointer, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
    """Restore the newest checkpoint whose manifest verifies.

    Args:
        ckpt: the checkpointer (its directory, bucket mirror and manifests).
        abstract_state: pytree of ``jax.ShapeDtypeStruct`` (with shardings, to restore
            sharded arrays) or arrays with the state's structure.

    Returns:
        ``(step, state, manifest)``, or None when no checkpoint verifies (start fresh).
        Checkpoints newer than the restored one are logged and deleted (by process 0).

    Raises:
        CheckpointMismatch: the newest verified checkpoint has another tree structure,
            shape or dtype than ``abstract_state`` (nothing is loaded).
    """
    if ckpt.sharded:
        found = _restore_sharded(ckpt, abstract_state)
        if found is not None:
            return found
    if ckpt.mirror is not None:  # an orbax checkpoint (one process's, or a continuation's parent)
        _fetch_newest(ckpt)
    rejected: list[int] = []
    chosen = None
    for step in reversed(ckpt.steps()):
        problems = ckpt.problems(step)
        if not problems:
            chosen = step
            break
        ckpt.log.warning("checkpoint %s failed verification, skipped: %s",
                         ckpt.path(step), "; ".join(problems[:5]))
        rejected.append(step)
    if ckpt.primary:
        for step in rejected:
            ckpt.manager.delete(step)
            ckpt.manifest_path(step).unlink(missing_ok=True)
    if chosen is None:
        if ckpt.primary:
            (ckpt.step_dir / LATEST_MANIFEST).unlink(missing_ok=True)
        return None
    state, manifest = restore(ckpt, chosen, abstract_state)
    if ckpt.primary:
        write_json_atomic(ckpt.step_dir / LATEST_MANIFEST, manifest)
    ckpt.last_manifest = manifest
    return chosen, state, manifest

def restore(ckpt: Checkpointer, chosen: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Load the checkpoint of step ``chosen``, which the caller has verified (:meth:`problems` empty);
    writes nothing (a committed step's checkpoint is read this way by ``tidal export`` / ``sample``).

    Args:
        chosen: a step of :meth:`steps`.
        abstract_state: as for :meth:`restore_latest`.

    Returns:
        ``(state, manifest)``.

    Raises:
        CheckpointMismatch: the checkpoint has another tree structure, shape or dtype than
            ``abstract_state`` (nothing is loaded).
    """
    local = ckpt.local_sharded().get(chosen)
    if local is not None:
        return shards.restore(str(ckpt.step_dir), local, abstract_state, mismatch(ckpt.path(chosen))), local
    metadata = ckpt.manager.item_metadata(chosen)
    leaves = (getattr(metadata, "custom_metadata", None) or {}).get(PACKED_KEY)
    if leaves is not None:
        saved = {key: (tuple(shape), dtype) for key, shape, dtype in leaves}
    else:
        saved = tree_layout(getattr(metadata, "tree", None) or {})
    differences = layout_problems(saved, tree_layout(abstract_state))
    if differences:
        raise mismatch(ckpt.path(chosen))(differences)
    if leaves is not None:
        packed = ckpt.manager.restore(chosen, args=ocp.args.PyTreeRestore(restore_args=jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata.tree)))["packed"]
        state = unpack_state(packed, leaves, abstract_state)
    else:
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
        state = ckpt.manager.restore(chosen, args=ocp.args.PyTreeRestore(abstract_state, restore_args))
    return state, json.loads(ckpt.manifest_path(chosen).read_text())

def mismatch(where: Any) -> Callable[[list[str]], CheckpointMismatch]:
    return lambda lines: CheckpointMismatch(
        f"checkpoint {where} does not fit the model: " + "; ".join(lines) + "; rule: a checkpoint is restored "
        "only into a state of the same tree, shapes and dtypes (use a new step directory)")

def _restore_sharded(ckpt: Checkpointer, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
    """From the bucket, one process or many: process 0 chooses the newest sharded checkpoint that counts and
    is whole (:func:`tidal.train.shards.newest_whole`), every process reads its own shards of it in
    ``abstract_state``'s layout (:func:`tidal.train.shards.restore`: any mesh, any process count), each chunk
    checked against the manifest's sha256. When any process finds a chunk that does not match, every
    process learns it (one all-reduce of two counts), process 0 deletes that checkpoint (WARNING) and they try
    the next newest. None: there is none, or the newest checkpoint that counts is an orbax one (restored
    as before)."""
    from jax.experimental import multihost_utils

    location = ckpt.mirror.location
    many = jax.process_count() > 1
    while True:
        chosen = shards.newest_whole(ckpt.mirror, ckpt.log) if ckpt.primary else None
        agreed = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if chosen is None else chosen))
                     if many else (-1 if chosen is None else chosen))
        if agreed < 0:
            return None
        manifest = shards.read_manifest(location, agreed)
        if manifest is None:
            raise CheckpointMismatch(f"checkpoint {agreed} at {location}: process 0 chose it but its manifest is "
                                     f"unreadable on process {jax.process_index()}; rule: every process restores "
                                     "the same checkpoint")
        where = uris.join(location, CHECKPOINT_DIR, str(agreed))
        # every process reaches the all-reduce, whatever its read raised: one that raised alone would leave
        # the others waiting in it for the peer timeout
        failure: Exception | None = None
        try:
            state, corrupt = shards.restore(location, manifest, abstract_state, mismatch(where)), ""
        except shard_arrays.CorruptChunk as err:
            state, corrupt = None, str(err)
        except Exception as err:  # noqa: BLE001 - raised below, on this process, after the all-reduce
            state, corrupt, failure = None, "", err
        mine = np.array([bool(corrupt), failure is not None], np.int32)
        corrupted, failed = distributed.sum_over_processes(mine) if many else mine  # processes that found each
        if failure is not None:
            raise failure
        if failed:
            raise CheckpointMismatch(f"checkpoint {agreed} at {location}: {failed} process(es) could not read it "
                                     "(see their logs); rule: every process restores the same checkpoint")
        if not corrupted:
            break
        if corrupt:
            ckpt.log.warning("checkpoint %d at %s failed verification, skipped and deleted: %s", agreed, location,
                             corrupt)
        if ckpt.primary:
            if not corrupt:
                ckpt.log.warning("checkpoint %d at %s failed verification on %d other process(es) (see their "
                                 "logs), skipped and deleted", agreed, location, corrupted)
            ckpt.mirror.delete(agreed)
    read = shard_arrays.addressable_bytes(state)
    ckpt.log.info("read checkpoint %d from %s: this process's shards, %d of its %d bytes", agreed, location,
                  read, manifest["total_bytes"])
    if ckpt.primary:
        write_json_atomic(ckpt.step_dir / LATEST_MANIFEST, manifest)
    ckpt.last_manifest = manifest
    return agreed, state, manifest

def _fetch_newest(ckpt: Checkpointer) -> None:
    """Bring the newest checkpoint of the bucket that verifies into the local directory (a fresh
    process, maybe on a fresh node); the ones newer than it are deleted from the bucket. In a
    multi-process run process 0 chooses and every other process fetches that one.

    Raises:
        CheckpointMismatch: the checkpoint process 0 chose does not verify on this process.
    """
    if jax.process_count() == 1:  # (a mirror makes a Checkpointer sharded: one process decides alone)
        _fetch_verified(ckpt)
        return
    chosen = _fetch_verified(ckpt) if ckpt.primary else None
    from jax.experimental import multihost_utils

    agreed = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if chosen is None else chosen)))
    if ckpt.primary or agreed < 0:
        return
    if _fetch_one(ckpt, agreed) is None:
        raise CheckpointMismatch(f"checkpoint {agreed} at {ckpt.mirror.location} verified on process 0 but "
                                 f"not on process {jax.process_index()}; rule: every process restores the "
                                 "same verified checkpoint")

def _fetch_verified(ckpt: Checkpointer) -> int | None:
    """The step of the newest checkpoint there that verifies, fetched unless already here."""
    local = set(ckpt.steps())
    for step in reversed(ckpt.mirror.steps()):
        if step in local and not ckpt.problems(step):
            return step
        if _fetch_one(ckpt, step) is not None:
            return step
        if ckpt.primary:
            ckpt.mirror.delete(step)
    return None

def _fetch_one(ckpt: Checkpointer, step: int) -> dict[str, Any] | None:
    manifest = ckpt.mirror.fetch(step, ckpt.path(step))
    if manifest is not None:
        write_json_atomic(ckpt.manifest_path(step), manifest)
        ckpt.log.info("fetched checkpoint %d from %s (%d bytes)", step, ckpt.mirror.location,
                      manifest["total_bytes"])
    return manifest


__all__ = ["CheckpointMismatch", "mismatch", "restore", "restore_latest"]
