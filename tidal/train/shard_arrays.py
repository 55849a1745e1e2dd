"""Sharded checkpoints, the arrays: a process's shards to and from one zarr v2 array per leaf through TensorStore.

What a process holds (:func:`copy_to_host`: its addressable shards whose ``replica_id`` is 0, split into
chunks of at most :data:`CHUNK_BYTES`), how it writes them (:func:`write_arrays`: one object per chunk, raw
C-order little-endian bytes, uncompressed, each with its size and sha256) and how it reads a saved state
back in another layout (:func:`read_arrays`: only the chunks that overlap its own devices' shards of the
target sharding). The bucket protocol around them (records, the manifest written last, what counts) is
:mod:`tidal.train.shards`. Sources: Levanter's tensorstore_serialization (one array per leaf, per-process
writes); jax.experimental.array_serialization (replica-0 writes, reads by target index, chunk shapes).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import itertools
import json
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urlparse

import jax
import numpy as np
import tensorstore as ts

from tidal.context import is_uri
from tidal.settings import current
from tidal.storage import gcs, uris
from tidal.storage.base import StorageSettings
from tidal.train.packing import _path_key, layout_problems


def kvstore(location: str, settings: StorageSettings | None = None) -> dict[str, Any]:
    """The TensorStore kvstore spec of a directory ``location``: ``file`` for a local path, ``s3`` for
    ``s3://bucket/prefix`` (the endpoint of ``TIDAL_S3_ENDPOINT_URL`` or ``storage.endpoint_url``, the
    region of the storage settings, default ``us-east-1``; credentials from ``AWS_*`` as boto3 reads them),
    ``gcs`` for ``gs://bucket/prefix`` (TensorStore's own GCS client: Application Default Credentials, the
    endpoint of ``TIDAL_GCS_ENDPOINT_URL``; the JSON API the manifest goes through too, :mod:`tidal.storage.gcs`),
    or ``s3`` for it when ``TIDAL_S3_ENDPOINT_URL`` puts an S3 server in the bucket's place
    (:func:`tidal.storage.uris.on_gcs`).

    Raises:
        ValueError: another scheme.
    """
    if not is_uri(location):
        return {"driver": "file", "path": location.removeprefix("file://").rstrip("/") + "/"}
    parsed = urlparse(location)
    path = parsed.path.strip("/") + "/"
    if uris.on_gcs(location):
        gcs.tensorstore_env()
        return {"driver": "gcs", "bucket": parsed.netloc, "path": path}
    if parsed.scheme not in ("s3", "gs"):
        raise ValueError(f"{location}: a sharded checkpoint needs a local path, s3:// or gs://")
    settings = settings or StorageSettings()
    # a gs:// bucket through an S3 endpoint (GCS's own XML API included) signs for region "auto"
    spec: dict[str, Any] = {"driver": "s3", "bucket": parsed.netloc, "path": path,
                            "aws_region": settings.region or ("auto" if parsed.scheme == "gs" else "us-east-1")}
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
    return ".".join(str((s.start or 0) // max(1, c)) for s, c in zip(index, chunks, strict=True))


def _array_spec(store: dict[str, Any], name: str, shape: tuple[int, ...], dtype: Any,
                chunks: tuple[int, ...]) -> dict[str, Any]:
    return {"driver": "zarr", "kvstore": {**store, "path": f"{store['path']}{name}/"},
            # an all-zero shard (fresh Adam moments) is written too, not elided as the fill value
            "store_data_equal_to_fill_value": True,
            "metadata": {"shape": list(shape), "chunks": [max(1, c) for c in chunks],
                         "dtype": _zarr_dtype(dtype), "compressor": None, "fill_value": None, "order": "C"}}


# A request the bucket keeps failing is retried this way (TensorStore's default, 32 retries of up to 32 s,
# waits about 15 minutes): at most about 16 s, then the save fails and training stops with one error line
# (issue 37, item 2); the task's retry resumes from the newest checkpoint that counts.
REQUEST_RETRIES = {"max_retries": 8, "initial_delay": "0.1s", "max_delay": "5s"}


def zarray_bytes(shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...]) -> bytes:
    """A leaf's zarr v2 ``.zarray`` (the metadata :func:`_array_spec` describes), as this module writes it: any
    zarr v2 reader opens the array from it, TensorStore's included."""
    return json.dumps({"chunks": [max(1, c) for c in chunks], "compressor": None, "dimension_separator": ".",
                       "dtype": _zarr_dtype(dtype), "fill_value": None, "filters": None, "order": "C",
                       "shape": list(shape), "zarr_format": 2}, sort_keys=True, indent=2).encode()


def _context() -> ts.Context:
    """One TensorStore context for every array of a save or restore: one HTTP connection pool and request
    limit for all of them, no chunk cache (each byte is written or read once), bounded retries."""
    return ts.Context({"cache_pool": {"total_bytes_limit": 0}, "s3_request_concurrency": {"limit": 32},
                       "s3_request_retries": REQUEST_RETRIES, "gcs_request_retries": REQUEST_RETRIES})


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
    chunks = tuple(max(1, c) for c in chunks)  # a zero-size dimension: no chunk along it
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


def sha256_of(data: np.ndarray) -> str:
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


def write_arrays(base: str, host: HostShards, *, create_metadata: bool, workers: int = 8) -> dict[str, list]:
    """Write this process's chunks (``host``) of the checkpoint at ``base`` (a directory: local path, s3://
    or gs://).

    Args:
        create_metadata: write each leaf's ``.zarray`` (:func:`zarray_bytes`; process 0).
        workers: objects written at a time (TensorStore's own requests run beside them).

    Returns:
        ``{object key under base: [bytes, sha256]}`` of every object written (the ``.zarray`` files too
        when ``create_metadata``).

    Raises:
        Whatever TensorStore raises (ValueError on a refused write, an unreachable endpoint).
    """
    store = kvstore(base)
    context = _context()
    # no I/O to open: the metadata is ours (process 0 writes it below, as bytes it hashes), so a save costs one
    # request per object, not TensorStore's read, create and our read-back of each leaf's .zarray
    stores = {name: ts.open(_array_spec(store, name, shape, dtype, chunks), open=True, assume_metadata=True,
                            context=context) for name, shape, dtype, chunks in host.leaves}
    stores = {name: future.result() for name, future in stores.items()}
    record: dict[str, list] = {}

    def one(shard: tuple[str, str, tuple[slice, ...], np.ndarray]) -> tuple[str, list]:
        name, key, index, data = shard
        data = np.require(data, requirements="C")  # not ascontiguousarray: it makes a scalar 1-D
        # the host copy is ours (or a state nobody mutates: host_state), so TensorStore may send from it
        # without a copy of its own
        stores[name][index].write(data, can_reference_source_data_indefinitely=True).result()
        return f"{name}/{key}", [int(data.nbytes), sha256_of(data)]

    def metadata(leaf: tuple[str, tuple[int, ...], str, tuple[int, ...]]) -> tuple[str, list]:
        name, shape, dtype, chunks = leaf
        meta = zarray_bytes(shape, dtype, chunks)
        uris.write_bytes(uris.join(base, name, ".zarray"), meta)
        return f"{name}/.zarray", [len(meta), hashlib.sha256(meta).hexdigest()]

    # the metadata's client made once here: eight threads missing the cache at once made eight (~10 MB each)
    if create_metadata and uris.on_gcs(base):
        gcs.client()
    elif create_metadata and is_uri(base):
        uris.client_for(base)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-shards") as pool:
        if create_metadata:
            record.update(pool.map(metadata, host.leaves))
        record.update(pool.map(one, host.shards))
    return record


class CorruptChunk(ValueError):
    """An object of a sharded checkpoint, read back, does not have the sha256 its manifest records."""


def _chunk_boxes(index: tuple[slice, ...], shape: tuple[int, ...],
                 chunks: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """The saved chunks (global boxes) that overlap the region ``index`` of a leaf of ``shape``."""
    chunks = tuple(max(1, c) for c in chunks)
    ranges = [range((s.start // c) * c, s.stop, c) for s, c in zip(index, chunks, strict=True)]
    return [tuple(slice(a, min(a + c, d)) for a, c, d in zip(starts, chunks, shape, strict=True))
            for starts in itertools.product(*ranges)]


def _region(index: Any, shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(s.start or 0, s.stop if s.stop is not None else d) for s, d in zip(index, shape, strict=True))


def read_arrays(base: str, leaves: list, abstract_state: Any,
                on_mismatch: Callable[[list[str]], Exception] | None = None,
                max_inflight_bytes: int = 64 * 2**20, checksums: dict[str, str] | None = None) -> Any:
    """Read the saved state at ``base`` (its ``leaves``: ``[[name, shape, dtype, chunk shape]]`` as a
    manifest lists them) into the layout of ``abstract_state``.

    Each process reads whole saved chunks (one object each), only those that overlap its devices' shards,
    checks each against ``checksums`` and copies the overlap into its shards: the check covers every byte
    it loads, whatever the mesh it restores onto.

    Args:
        abstract_state: pytree of ``jax.ShapeDtypeStruct`` with ``sharding`` (each process reads only
            the chunks overlapping its devices' shards of that sharding), or of arrays / structs without
            one (read whole into host numpy arrays).
        on_mismatch: builds the exception raised when the tree, a shape or a dtype differs (default
            ValueError).
        max_inflight_bytes: bytes of saved chunks read and not yet copied into this process's shards (at
            least one chunk, at most :data:`CHUNK_BYTES`). This process's host memory beyond its device
            arrays is at most its part of the leaves being assembled (each goes to its devices when whole) plus
            this, whatever the mesh that saved it; freed memory is handed back to the OS as it goes
            (:func:`release_free_memory`).
        checksums: ``{object key under base: sha256}`` (the manifest's ``files``); None reads unchecked.

    Returns:
        The state: ``jax.Array`` leaves placed by ``abstract_state``'s shardings (numpy without one).

    Raises:
        ValueError (or ``on_mismatch``'s): the checkpoint's leaves differ from ``abstract_state``'s.
        CorruptChunk: a chunk read does not match its checksum (nothing is returned).
    """
    saved = {name: (tuple(shape), dtype) for name, shape, dtype, _ in leaves}
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    wanted = {leaf_name(path): (tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name)
              for path, leaf in flat}
    mismatch = layout_problems(saved, wanted)
    if mismatch:
        raise (on_mismatch or (lambda lines: ValueError("; ".join(lines))))(mismatch)
    store = kvstore(base)
    chunks = {name: tuple(c) for name, _, _, c in leaves}
    context = _context()
    # the manifest lists every leaf's shape, dtype and chunks: opening reads nothing (the .zarray objects are
    # in the manifest, checked like every other object by whoever verifies the checkpoint's listing)
    opened = {name: ts.open(_array_spec(store, name, saved[name][0], saved[name][1], chunks[name]), open=True,
                            assume_metadata=True, context=context) for name in wanted}
    opened = {name: future.result() for name, future in opened.items()}
    out: list[Any] = [None] * len(flat)
    window: deque[tuple[_LeafRead, str, tuple[slice, ...], Any, int]] = deque()
    inflight = since_trim = 0

    def consume() -> None:
        nonlocal inflight, since_trim
        read, key, box, future, nbytes = window.popleft()
        data = future.result()
        if checksums is not None:
            expected = checksums.get(f"{read.name}/{key}")
            if expected is None:
                raise CorruptChunk(f"{base}: {read.name}/{key} is read but not in its manifest")
            if sha256_of(np.require(data, requirements="C")) != expected:
                raise CorruptChunk(f"{base}: {read.name}/{key} does not match its manifest's sha256")
        read.place(box, data)
        del data
        inflight -= nbytes
        if read.done():
            out[read.index] = read.result()
        since_trim += nbytes
        if since_trim >= max_inflight_bytes:
            release_free_memory()
            since_trim = 0

    for index, (path, leaf) in enumerate(flat):
        name = leaf_name(path)
        shape, dtype = saved[name][0], np.dtype(saved[name][1])
        read = _LeafRead(index, name, leaf, shape, dtype)
        boxes = {_chunk_key(box, chunks[name]): box for region in read.regions.values()
                 for box in _chunk_boxes(region, shape, chunks[name])}
        read.pending = len(boxes)
        if not boxes:  # a leaf with a zero-size dimension: nothing saved, nothing to read
            out[index] = read.result()
            continue
        for key, box in boxes.items():
            nbytes = dtype.itemsize * int(np.prod([b.stop - b.start for b in box]))
            window.append((read, key, box, opened[name][box].read() if box else opened[name].read(), nbytes))
            inflight += nbytes
            while inflight > max_inflight_bytes and len(window) > 1:  # host memory: the state's share + this
                consume()
    while window:
        consume()
    gc.collect()  # cycles (TensorStore's futures and their callbacks) otherwise keep chunk buffers a while
    release_free_memory()
    return jax.tree_util.tree_unflatten(treedef, out)


@cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Give the heap memory this process has freed back to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    A restore reads chunk after chunk into buffers it frees at once, but glibc keeps freed blocks below its
    mmap threshold (which grows to 32 MiB as large blocks are freed) for reuse, so a process held about its
    share of the state a second time after a restore. Measured here (bench/checkpoint_scale.py --store gs
    --scale 32768: 940 MB of state, 2 restoring processes of 448 MB each): 715 MB above their start after
    the restore, 523-619 MB with this and a ``gc.collect()`` at the end; the restore's peak beyond its device
    arrays 0.441 -> 0.338 of the state. Called every ``max_inflight_bytes`` of chunks read and at the end;
    it costs milliseconds.
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _key(region: tuple[slice, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in region)


class _LeafRead:
    """One leaf being read: its target regions (one per distinct shard this process holds: replicas on
    several of its devices share one host copy), filled chunk by chunk as the saved chunks arrive."""

    def __init__(self, index: int, name: str, leaf: Any, shape: tuple[int, ...], dtype: np.dtype):
        self.index, self.name, self.leaf, self.dtype = index, name, leaf, dtype
        self.sharding = getattr(leaf, "sharding", None)
        whole = _region([slice(None)] * len(shape), shape)
        self.devices = ([(None, whole)] if self.sharding is None else
                        [(device, _region(idx, shape))
                         for device, idx in self.sharding.addressable_devices_indices_map(tuple(shape)).items()])
        self.regions = {_key(region): region for _, region in self.devices}
        self.parts: dict[tuple, np.ndarray] = {}
        self.pending = 0

    def place(self, box: tuple[slice, ...], data: np.ndarray) -> None:
        """Copy what ``data`` (the saved chunk at ``box``) holds of each region into that region's part;
        a region that is exactly this chunk takes ``data`` itself (restored onto the mesh that saved it)."""
        self.pending -= 1
        for key, region in self.regions.items():
            if box == region:
                self.parts[key] = data
                continue
            inside = tuple(slice(max(b.start, r.start), min(b.stop, r.stop)) for b, r in zip(box, region, strict=True))
            if any(i.start >= i.stop for i in inside):
                continue
            if key not in self.parts:
                self.parts[key] = np.empty(tuple(r.stop - r.start for r in region), self.dtype)
            self.parts[key][tuple(slice(i.start - r.start, i.stop - r.start) for i, r in zip(inside, region,
                                                                                           strict=True))] = \
                data[tuple(slice(i.start - b.start, i.stop - b.start) for i, b in zip(inside, box, strict=True))]

    def done(self) -> bool:
        return self.pending == 0

    def result(self) -> Any:
        """The leaf: a host array (no sharding) or a ``jax.Array`` placed by the target sharding."""
        parts = {key: self.parts.get(key, np.empty(tuple(r.stop - r.start for r in region), self.dtype))
                 for key, region in self.regions.items()}
        if self.sharding is None:
            return parts[_key(self.devices[0][1])]
        arrays = [jax.device_put(parts[_key(region)], device) for device, region in self.devices]
        return jax.make_array_from_single_device_arrays(tuple(self.leaf.shape), self.sharding, arrays)


__all__ = [
    "CHUNK_BYTES",
    "CorruptChunk",
    "HostShards",
    "addressable_bytes",
    "chunk_shape",
    "copy_to_host",
    "kvstore",
    "leaf_name",
    "read_arrays",
    "release_free_memory",
    "sha256_of",
    "write_arrays",
    "zarray_bytes",
]
