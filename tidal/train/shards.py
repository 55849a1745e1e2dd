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

Restore (:func:`restore`): each process opens every leaf and reads only the chunks that overlap its
own devices' shards of the *target* sharding, so a checkpoint written by H processes with mesh M
restores onto H' processes with mesh M' (the chunk grid is M's, the reads are M''s).

Memory: a save copies this process's own shards to host memory (the device-to-host copy the step loop
waits for: its share of the state, 1/H of it) and keeps nothing else; TensorStore writes from those
copies. Sources: Levanter's tensorstore_serialization (one array per leaf, per-process writes, a
marker written last); jax.experimental.array_serialization (replica-0 writes, reads by target index).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import jax
import numpy as np
import tensorstore as ts

from tidal.context import is_uri
from tidal.integrity.hashing import manifest_of, manifest_text, sha256_bytes
from tidal.settings import current
from tidal.storage import uris
from tidal.storage.base import StorageSettings
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR, CheckpointMirror
from tidal.train.packing import _path_key, layout_problems

FORMAT = "tidal-sharded-1"
RECORDS = "_shards"
log = logging.getLogger("tidal.train.checkpoints")


class ShardedCommitTimeout(RuntimeError):
    """Process 0 waited the bounded time and a process's record of a checkpoint is still missing."""


def kvstore(location: str, settings: StorageSettings | None = None) -> dict[str, Any]:
    """The TensorStore kvstore spec of a directory ``location``: ``file`` for a local path, ``s3`` for
    ``s3://bucket/prefix`` (the endpoint of ``TIDAL_S3_ENDPOINT_URL`` or ``storage.endpoint_url``, the
    region of the storage settings, default ``us-east-1``; credentials from ``AWS_*`` as boto3 reads them),
    ``gcs`` for ``gs://bucket/prefix`` (TensorStore's own GCS client: Application Default Credentials).

    Raises:
        ValueError: another scheme.
    """
    if not is_uri(location):
        return {"driver": "file", "path": location.removeprefix("file://").rstrip("/") + "/"}
    parsed = urlparse(location)
    path = parsed.path.strip("/") + "/"
    if parsed.scheme == "gs":
        return {"driver": "gcs", "bucket": parsed.netloc, "path": path}
    if parsed.scheme != "s3":
        raise ValueError(f"{location}: a sharded checkpoint needs a local path, s3:// or gs://")
    settings = settings or StorageSettings()
    spec: dict[str, Any] = {"driver": "s3", "bucket": parsed.netloc, "path": path,
                            "aws_region": settings.region or "us-east-1"}
    endpoint = current().s3_endpoint_url or settings.endpoint_url
    if endpoint:
        spec["endpoint"] = str(endpoint).rstrip("/")  # path-style: {endpoint}/{bucket}/{key}
    return spec


def leaf_name(path: Any) -> str:
    """A leaf's folder in the checkpoint: its key path with dots (``opt_state.1.0.mu.w``)."""
    return _path_key(path).replace("/", ".")


def _chunk_key(index: tuple[slice, ...], chunks: tuple[int, ...]) -> str:
    """The zarr v2 key of the chunk a shard fills (``dimension_separator`` ``.``; ``0`` for a scalar)."""
    if not chunks:
        return "0"
    return ".".join(str((s.start or 0) // c) for s, c in zip(index, chunks, strict=True))


def _array_spec(store: dict[str, Any], name: str, shape: tuple[int, ...], dtype: Any,
                chunks: tuple[int, ...]) -> dict[str, Any]:
    return {"driver": "zarr", "kvstore": {**store, "path": f"{store['path']}{name}/"},
            # an all-zero shard (fresh Adam moments) is written too, not elided as the fill value
            "store_data_equal_to_fill_value": True,
            "metadata": {"shape": list(shape), "chunks": [max(1, c) for c in chunks],
                         "dtype": _zarr_dtype(dtype), "compressor": None, "fill_value": None, "order": "C"}}


def _context() -> ts.Context:
    """One TensorStore context for every array of a save or restore: one HTTP connection pool and request
    limit for all of them, and no chunk cache (each byte is written or read once)."""
    return ts.Context({"cache_pool": {"total_bytes_limit": 0}, "s3_request_concurrency": {"limit": 32}})


def _zarr_dtype(dtype: Any) -> str:
    """zarr v2's dtype string: numpy's little-endian one (``<f4``), or TensorStore's name for the
    ml_dtypes types numpy has no code for (``bfloat16``, the float8s)."""
    dtype = np.dtype(dtype)
    return dtype.name if dtype.kind == "V" else dtype.newbyteorder("<").str


@dataclass
class HostShards:
    """One process's part of a checkpoint, copied to host memory by :func:`copy_to_host`.

    Attributes:
        leaves: ``[(name, global shape, dtype, chunk shape)]`` of every leaf, in tree order.
        shards: ``[(leaf name, chunk key, global index, host array)]`` of the chunks this process writes
            (views of its shards' host copies).
    """

    leaves: list[tuple[str, tuple[int, ...], str, tuple[int, ...]]]
    shards: list[tuple[str, str, tuple[slice, ...], np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for *_, a in self.shards)


CHUNK_BYTES = 64 * 2**20  # the largest object of a checkpoint (a shard is split into chunks of at most this)


def chunk_shape(shard_shape: tuple[int, ...], itemsize: int, target_bytes: int = CHUNK_BYTES) -> tuple[int, ...]:
    """The zarr chunk of a leaf whose shards have ``shard_shape``: the shard, divided along its longest
    axes by their smallest prime factors until it holds at most ``target_bytes`` (or cannot be divided).
    A chunk never spans two shards, so each object has one writer; and a read of another layout holds at
    most the chunks it overlaps. Rule after jax.experimental.array_serialization's chunk-shape choice."""
    chunk = list(shard_shape)
    while chunk and int(np.prod(chunk)) * itemsize > target_bytes:
        axes = [a for a in sorted(range(len(chunk)), key=lambda a: -chunk[a]) if chunk[a] > 1]
        if not axes:
            break
        axis = axes[0]
        factor = next(f for f in range(2, chunk[axis] + 1) if chunk[axis] % f == 0)
        chunk[axis] //= factor
    return tuple(chunk)


def _blocks(index: tuple[slice, ...], chunks: tuple[int, ...]) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """The chunks of a shard at ``index`` (global slices): ``(global index, index within the shard)`` each."""
    ranges = [range(s.start, s.stop, c) for s, c in zip(index, chunks, strict=True)]
    out = []
    for starts in np.ndindex(*(len(r) for r in ranges)) if ranges else [()]:
        glob = tuple(slice(r[i], min(r[i] + c, s.stop)) for r, i, c, s in zip(ranges, starts, chunks, index,
                                                                             strict=True))
        out.append((glob, tuple(slice(g.start - s.start, g.stop - s.start) for g, s in zip(glob, index,
                                                                                             strict=True))))
    return out


def copy_to_host(state: Any, *, copy: bool = True, chunk_bytes: int = CHUNK_BYTES) -> HostShards:
    """The shards of ``state`` this process writes (addressable, ``replica_id == 0``), on the host, as the
    chunks they are written in (:func:`chunk_shape`).

    Args:
        state: pytree of ``jax.Array`` (or numpy arrays: one process, unsharded).
        copy: copy each shard (the caller may donate or overwrite the arrays after this returns);
            False keeps references (the trainer's ``host_state``: arrays never mutated or donated).
        chunk_bytes: the largest chunk (object) of a leaf.
    """
    leaves, shards = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = leaf_name(path)
        shape, dtype = tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype)
        if isinstance(leaf, jax.Array):
            shard_shape = tuple(int(c) for c in leaf.sharding.shard_shape(leaf.shape))
            owned = [(s.index, s.data) for s in leaf.addressable_shards if s.replica_id == 0]
        else:
            shard_shape = shape
            owned = [(tuple(slice(0, d) for d in shape), leaf)]
        chunks = chunk_shape(shard_shape, dtype.itemsize, chunk_bytes)
        leaves.append((name, shape, dtype.name, chunks))
        for index, data in owned:
            index = tuple(slice(s.start or 0, s.stop if s.stop is not None else d) for s, d in
                          zip(index, shape, strict=True))
            host = np.array(data, copy=copy) if copy else np.asarray(data)
            for glob, local in _blocks(index, chunks):
                shards.append((name, _chunk_key(glob, chunks), glob, host[local]))
    return HostShards(leaves, shards)


def _sha256(data: np.ndarray) -> str:
    """sha256 of an array's raw bytes (C order), as its uncompressed zarr chunk holds them."""
    return hashlib.sha256(data.reshape(-1).view(np.uint8)).hexdigest()


def addressable_bytes(state: Any) -> int:
    """Bytes of ``state`` this process holds, each distinct shard once (a leaf replicated over this
    process's devices counts once): what a restore read for it."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(state):
        if isinstance(leaf, jax.Array):
            seen = {tuple((s.start, s.stop) for s in shard.index): shard.data.nbytes
                    for shard in leaf.addressable_shards}
            total += sum(seen.values())
        else:
            total += np.asarray(leaf).nbytes
    return total


def _checkpoint(location: str, step: int) -> str:
    return uris.join(location, CHECKPOINT_DIR, str(step))


def _manifest(location: str, step: int) -> str:
    return uris.join(location, MANIFEST_DIR, f"{step}.json")


def write_shards(location: str, step: int, host: HostShards, *, process: int, create_metadata: bool,
                 workers: int = 8) -> dict[str, list]:
    """Write this process's shards of checkpoint ``step`` under ``location``, then its record.

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
    store = kvstore(base)
    context = _context()
    stores = {}
    for name, shape, dtype, chunks in host.leaves:
        spec = _array_spec(store, name, shape, dtype, chunks)
        opened = (ts.open(spec, create=True, open=True, context=context) if create_metadata
                  else ts.open(spec, open=True, assume_metadata=True, context=context))
        stores[name] = opened
    stores = {name: future.result() for name, future in stores.items()}
    record: dict[str, list] = {}

    def one(shard: tuple[str, str, tuple[slice, ...], np.ndarray]) -> tuple[str, list]:
        name, key, index, data = shard
        data = np.require(data, requirements="C")  # not ascontiguousarray: it makes a scalar 1-D
        # the host copy is ours (or a state nobody mutates: host_state), so TensorStore may send from it
        # without a copy of its own
        stores[name][index].write(data, can_reference_source_data_indefinitely=True).result()
        return f"{name}/{key}", [int(data.nbytes), _sha256(data)]

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-shards") as pool:
        record.update(pool.map(one, host.shards))
    if create_metadata:
        for name, *_ in host.leaves:
            meta = uris.read_bytes(uris.join(base, name, ".zarray"))
            record[f"{name}/.zarray"] = [len(meta), hashlib.sha256(meta).hexdigest()]
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
    write_shards(location, step, host, process=jax.process_index(), create_metadata=primary)
    if not primary:
        mirror.uploads.append((step, host.nbytes, time.perf_counter() - sent))
        return None
    for name, data in sidecars.items():
        uris.write_bytes(uris.join(location, name), data)
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
    """Read checkpoint ``manifest["step"]`` into the layout of ``abstract_state``.

    Args:
        abstract_state: pytree of ``jax.ShapeDtypeStruct`` with ``sharding`` (each process reads only
            the chunks overlapping its devices' shards of that sharding), or of arrays / structs without
            one (read whole into host numpy arrays).
        on_mismatch: builds the exception raised when the tree, a shape or a dtype differs (default
            ValueError).
        max_inflight_bytes: bytes of this process's shards read before they are placed (at least one
            leaf's). A read of a shard that spans saved chunks holds those whole chunks for a moment (up
            to 2x the shard when the split changed by 2 along one axis), so this process's memory beyond
            its share of the state is about twice this, or twice its largest leaf's share.

    Returns:
        The state: ``jax.Array`` leaves placed by ``abstract_state``'s shardings (numpy without one).

    Raises:
        ValueError (or ``on_mismatch``'s): the checkpoint's leaves differ from ``abstract_state``'s.
    """
    saved = {name: (tuple(shape), dtype) for name, shape, dtype, _ in manifest["leaves"]}
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    wanted = {leaf_name(path): (tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name)
              for path, leaf in flat}
    mismatch = layout_problems(saved, wanted)
    if mismatch:
        raise (on_mismatch or (lambda lines: ValueError("; ".join(lines))))(mismatch)
    store = kvstore(_checkpoint(location, manifest["step"]))
    chunks = {name: tuple(c) for name, _, _, c in manifest["leaves"]}
    context = _context()
    opened = {name: ts.open(_array_spec(store, name, saved[name][0], saved[name][1], chunks[name]), open=True,
                            context=context) for name in wanted}
    opened = {name: future.result() for name, future in opened.items()}
    out: list[Any] = []
    pending: list[tuple[Any, Any, list]] = []
    inflight = 0

    def drain() -> None:
        for leaf, sharding, parts in pending:
            if sharding is None:
                out.append(np.asarray(parts[0][1].result()))
                continue
            arrays = [jax.device_put(future.result(), device) for device, future in parts]
            out.append(jax.make_array_from_single_device_arrays(tuple(leaf.shape), sharding, arrays))
        pending.clear()

    for path, leaf in flat:
        name = leaf_name(path)
        sharding = getattr(leaf, "sharding", None)
        views = ([(None, opened[name])] if sharding is None else
                 [(device, opened[name][index])
                  for device, index in sharding.addressable_devices_indices_map(leaf.shape).items()])
        pending.append((leaf, sharding, [(device, view.read()) for device, view in views]))
        inflight += sum(np.dtype(saved[name][1]).itemsize * int(np.prod(view.shape)) for _, view in views)
        if inflight >= max_inflight_bytes:  # bound the reads in flight: host memory is the state's share
            drain()
            inflight = 0
    drain()
    return jax.tree_util.tree_unflatten(treedef, out)


__all__ = [
    "FORMAT",
    "HostShards",
    "ShardedCommitTimeout",
    "addressable_bytes",
    "commit",
    "committed_entries",
    "copy_to_host",
    "kvstore",
    "leaf_name",
    "newest_whole",
    "problems",
    "read_manifest",
    "restore",
    "save",
    "uncounted",
    "write_shards",
]
