"""Sharded checkpoints: every process writes the shards it owns straight to the bucket.

No process gathers the train state and no disk stages it: each process writes, through a
TensorStore kvstore (``s3`` with the storage settings' endpoint and region, ``gcs``, or ``file`` for
a local root), only its addressable shards whose ``replica_id`` is 0 (a replicated shard is written
once, by the process holding its first replica). Layout of the checkpoint of step ``n`` under a
step's location (the same folders as :mod:`tidal.train.mirror`, so its listing, retention and delete
apply)::

    checkpoints/<n>/<leaf>/.zarray           zarr v2 metadata of one leaf (process 0), uncompressed
    checkpoints/<n>/<leaf>/<i>.<j>...        one object per chunk: its raw bytes (C order, little-endian)
    checkpoints/<n>/_shards/<process>.json   what that process wrote: ``{key: [bytes, sha256]}``
    checkpoint_manifests/<n>.json            the checkpoint's manifest, written LAST by process 0

``<leaf>`` is the leaf's key path (``params.blocks.0.attn.kernel``); the chunk grid of a leaf divides its
shard shape (a shard of more than :data:`CHUNK_BYTES` is split, :func:`chunk_shape`), so each object is
written by exactly one process, never read-modify-written, and at most 64 MiB.

Commit: a process writes its arrays, then its record under ``_shards/`` (the size and sha256 of each
object as written: the chunk is the shard's raw bytes, so hashing the host copy hashes the object,
tests/train/test_shards.py checks it against the bucket). Process 0 waits (bounded) until every
process's record is there, merges them into the manifest and writes it last: from then on the
checkpoint counts. A writer killed before that leaves arrays without a manifest, which no restore
reads (:func:`uncounted` lists them) and the next save of that step replaces.

Restore (:func:`restore`): each process opens every leaf (no I/O: the manifest has its shape, dtype and
chunks) and reads only the whole chunks that overlap its own devices' shards of the *target* sharding,
each checked against the manifest's sha256, so a checkpoint written by H processes with mesh M restores
onto H' processes with mesh M' (the chunk grid is M's, the reads are M''s) and no byte is loaded unchecked.

Memory: a save copies this process's own shards to host memory (the device-to-host copy the step loop
waits for: its share of the state, 1/H of it) and keeps nothing else; TensorStore writes from those
copies. Sources: Levanter's tensorstore_serialization (one array per leaf, per-process writes, a
marker written last); jax.experimental.array_serialization (replica-0 writes, reads by target index).

This module is the bucket protocol (records, the manifest, what counts, retention); the arrays themselves
(host copies, chunk shapes, TensorStore specs, reads in another layout) are :mod:`tidal.train.shard_arrays`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from tidal.integrity.hashing import manifest_of, manifest_text, sha256_bytes
from tidal.storage import uris
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR, CheckpointMirror
from tidal.train.shard_arrays import HostShards, read_arrays, write_arrays

FORMAT = "tidal-sharded-1"
RECORDS = "_shards"
log = logging.getLogger("tidal.train.checkpoints")


class ShardedCommitTimeout(RuntimeError):
    """Process 0 waited the bounded time and a process's record of a checkpoint is still missing."""


def _checkpoint(location: str, step: int) -> str:
    return uris.join(location, CHECKPOINT_DIR, str(step))


def _manifest(location: str, step: int) -> str:
    return uris.join(location, MANIFEST_DIR, f"{step}.json")


def write_shards(location: str, step: int, host: HostShards, *, process: int, create_metadata: bool,
                 workers: int = 8) -> dict[str, list]:
    """Write this process's shards of checkpoint ``step`` under ``location``
    (:func:`~tidal.train.shard_arrays.write_arrays`), then its record.

    Args:
        create_metadata: write each leaf's ``.zarray`` (process 0; the others open without I/O).
        workers: shards written at a time (TensorStore's own requests run beside them).

    Returns:
        The record: ``{object key under checkpoints/<step>/: [bytes, sha256]}``.

    Raises:
        Whatever TensorStore raises (ValueError on a refused write, an unreachable endpoint): the
        checkpoint does not count.
    """
    base = _checkpoint(location, step)
    record = write_arrays(base, host, create_metadata=create_metadata, workers=workers)
    uris.write_bytes(uris.join(base, RECORDS, f"{process}.json"),
                     json.dumps({"process": process, "objects": record}, sort_keys=True).encode())
    return record


def commit(location: str, step: int, host: HostShards, *, processes: int, wait_s: float = 600.0,
           extra: dict[str, Any] | None = None, poll_s: float = 0.2) -> dict[str, Any]:
    """Process 0: wait until every process's record of checkpoint ``step`` is there, then write the
    manifest last (the checkpoint counts from then on).

    Args:
        host: process 0's :class:`HostShards` (the leaves' shapes and dtypes).
        processes: how many records to wait for.
        wait_s: the bound on that wait (a peer gone never writes its record).
        extra: more manifest fields (fingerprint, trainer state).

    Returns:
        The manifest: :func:`tidal.integrity.hashing.manifest_of` over every object of the checkpoint
        (``files``: ``[{path, bytes, sha256}]`` relative to ``checkpoints/<step>/``, the records included;
        ``total_bytes``; ``root_hash``), so :func:`~tidal.integrity.hashing.verify_manifest` checks a local
        copy as it checks an orbax checkpoint; plus ``format``, ``step``, ``processes``, ``leaves``
        (``[name, shape, dtype, chunk shape]``) and ``extra``.

    Raises:
        ShardedCommitTimeout: a record still missing after ``wait_s`` (the checkpoint does not count).
    """
    base = _checkpoint(location, step)
    deadline = time.monotonic() + wait_s
    wanted = {f"{p}.json" for p in range(processes)}
    while True:
        present = set(uris.list_sizes(uris.join(base, RECORDS)))
        if wanted <= present:
            break
        if time.monotonic() > deadline:
            missing = sorted(int(n[:-5]) for n in wanted - present)
            raise ShardedCommitTimeout(f"checkpoint {step} at {base}: no record from processes {missing} after "
                                       f"{wait_s:.0f} s (a process gone before its shards were written)")
        time.sleep(poll_s)
    objects: dict[str, list] = {}
    for p in range(processes):
        name = f"{RECORDS}/{p}.json"
        data = uris.read_bytes(uris.join(base, name))
        objects.update(json.loads(data)["objects"])
        objects[name] = [len(data), sha256_bytes(data)]  # the records are the checkpoint's files too
    files = [{"path": key, "bytes": size, "sha256": digest} for key, (size, digest) in sorted(objects.items())]
    manifest = {**(extra or {}), **manifest_of(files), "format": FORMAT, "step": step, "processes": processes,
                "leaves": [[n, list(s), d, list(c)] for n, s, d, c in host.leaves]}
    uris.write_bytes(_manifest(location, step), manifest_text(manifest).encode())
    return manifest


def committed_entries(location: str) -> list[dict[str, Any]]:
    """The step-manifest entries (``{path, bytes, sha256}``, relative to the step) of every sharded
    checkpoint that counts at ``location``: its objects and its manifest. The training run seals them
    with its local files (:func:`tidal.storage.staging.seal`), so the commit publishes them without
    anyone holding or re-reading the arrays."""
    entries = []
    for name in sorted(uris.list_sizes(uris.join(location, MANIFEST_DIR))):
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        data = uris.read_bytes(uris.join(location, MANIFEST_DIR, name))
        manifest = json.loads(data)
        if manifest.get("format") != FORMAT:
            continue
        entries.append({"path": f"{MANIFEST_DIR}/{name}", "bytes": len(data), "sha256": sha256_bytes(data)})
        entries += [{**f, "path": f"{CHECKPOINT_DIR}/{manifest['step']}/{f['path']}"} for f in manifest["files"]]
    return entries


def read_manifest(location: str, step: int) -> dict[str, Any] | None:
    """The manifest of checkpoint ``step`` (None: there is none, or it is not a sharded one)."""
    try:
        manifest = json.loads(uris.read_bytes(_manifest(location, step)))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return manifest if manifest.get("format") == FORMAT else None


def problems(location: str, manifest: dict[str, Any]) -> list[str]:
    """Why checkpoint ``manifest["step"]`` may not be restored: an object of its manifest missing or of
    another size in the listing (one listing; nothing is downloaded). Empty when it is whole."""
    base = _checkpoint(location, manifest["step"])
    sizes = uris.list_sizes(base)
    wrong = []
    for entry in manifest["files"]:
        size = sizes.get(entry["path"])
        if size != entry["bytes"]:
            wrong.append(f"{entry['path']}: " + ("missing" if size is None else
                                                  f"{size} bytes, manifest {entry['bytes']}"))
    return wrong


def uncounted(location: str) -> list[int]:
    """Steps with arrays under ``checkpoints/`` but no manifest: saves cut short, never restored."""
    names = uris.list_sizes(uris.join(location, CHECKPOINT_DIR))
    steps = {int(n.split("/", 1)[0]) for n in names if n.split("/", 1)[0].isdigit()}
    counted = set()
    for name in uris.list_sizes(uris.join(location, MANIFEST_DIR)):
        if name.endswith(".json") and name[:-5].isdigit():
            counted.add(int(name[:-5]))
    return sorted(steps - counted)


def save(mirror: CheckpointMirror, step: int, host: HostShards, *, primary: bool, wait_s: float,
         extra: dict[str, Any], sidecars: dict[str, bytes], log: logging.Logger,
         retain: Callable[[list[int]], set[int]]) -> dict[str, Any] | None:
    """A multi-process save of checkpoint ``step`` at ``mirror`` (a background job): this process's chunks
    and record; then, in process 0, ``sidecars`` (name -> bytes, beside the checkpoints), the manifest once
    every process's record is there (:func:`commit`), and retention in the bucket (``retain``: the steps
    to keep of those there). Each process's ``(step, bytes, seconds)`` goes to ``mirror.uploads``.

    Returns:
        The manifest (process 0), or None (the others).

    Raises:
        ShardedCommitTimeout, or what TensorStore or the bucket raise: the checkpoint does not count.
    """
    location, sent = mirror.location, time.perf_counter()
    mirror.check_fence()  # process 0's training lease (the others have no fence: its manifest fences them)
    write_shards(location, step, host, process=jax.process_index(), create_metadata=primary)
    if not primary:
        mirror.uploads.append((step, host.nbytes, time.perf_counter() - sent))
        return None
    for name, data in sidecars.items():
        uris.write_bytes(uris.join(location, name), data)
    mirror.check_fence()
    manifest = commit(location, step, host, processes=jax.process_count(), wait_s=wait_s, extra=extra)
    mirror.uploads.append((step, host.nbytes, time.perf_counter() - sent))
    log.info("checkpoint %d counts: in the bucket at %s (%d objects written by %d processes, %d bytes, %.2f s)",
             step, location, len(manifest["files"]), manifest["processes"], manifest["total_bytes"],
             time.perf_counter() - sent)
    mirror.prune(retain)
    return manifest


def newest_whole(mirror: CheckpointMirror, log: logging.Logger) -> int | None:
    """Process 0 at a restore: the newest checkpoint at ``mirror`` that counts, if it is a sharded one whose
    objects are all there at their sizes (one listing); None if there is none, or the newest is an orbax
    one. Arrays of a save cut short (no manifest) and checkpoints that fail that check are deleted
    (WARNING), so the re-done steps save again under the same numbers."""
    location = mirror.location
    for step in uncounted(location):
        log.warning("checkpoint %d at %s has arrays but no manifest (a save cut short): never counted, "
                    "deleted", step, location)
        uris.delete_dir(uris.join(location, CHECKPOINT_DIR, str(step)))
    for step in reversed(mirror.steps()):
        manifest = read_manifest(location, step)
        if manifest is None:
            return None
        wrong = problems(location, manifest)
        if not wrong:
            return step
        log.warning("checkpoint %d at %s failed verification, skipped and deleted: %s", step, location,
                    "; ".join(wrong[:5]))
        mirror.delete(step)
    return None


def restore(location: str, manifest: dict[str, Any], abstract_state: Any,
            on_mismatch: Callable[[list[str]], Exception] | None = None,
            max_inflight_bytes: int = 64 * 2**20) -> Any:
    """Read checkpoint ``manifest["step"]`` at ``location`` into the layout of ``abstract_state``: each
    process reads only the chunks its devices' shards overlap, each checked against the manifest's sha256
    (:func:`~tidal.train.shard_arrays.read_arrays` documents the arguments, the memory bound and the errors:
    :class:`~tidal.train.shard_arrays.CorruptChunk` when a chunk does not match)."""
    return read_arrays(_checkpoint(location, manifest["step"]), manifest["leaves"], abstract_state,
                       on_mismatch=on_mismatch, max_inflight_bytes=max_inflight_bytes,
                       checksums={f["path"]: f["sha256"] for f in manifest["files"]})


__all__ = [
    "FORMAT",
    "ShardedCommitTimeout",
    "commit",
    "committed_entries",
    "newest_whole",
    "problems",
    "read_manifest",
    "restore",
    "save",
    "uncounted",
    "write_shards",
]
