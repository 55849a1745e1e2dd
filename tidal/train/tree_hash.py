"""A content hash of a pytree of arrays that depends neither on a checkpoint's layout nor on the mesh.

Each process hashes only the shards it holds and the processes combine one small record per leaf: no host
gathers a leaf, let alone the tree (rule 0b of DESIGN.md).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tidal.train.distributed import sum_over_processes

# four independent 64-bit lanes: 256 bits per leaf (odd constants, the first 64 bits of the fractional parts of
# sqrt(2), sqrt(3), sqrt(5), sqrt(7), as SHA-2 takes its own)
_LANES = np.array([0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1], dtype=np.uint64)
_CHUNK = 1 << 20  # elements hashed at once: a few 8-byte temporaries of this size per process


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014),
    elementwise on uint64, arithmetic mod 2^64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _block_sums(values: np.ndarray, starts: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """The four lane sums (uint64, mod 2^64) of ``values``, the block of a leaf of ``shape`` whose first element
    sits at ``starts``: every element contributes ``mix(mix(flat index * K + bits) ^ lane)`` by its index in the
    whole leaf (C order) and its raw bits, so any partition of the leaf into blocks sums to the same."""
    with np.errstate(over="ignore"):
        bits = np.ascontiguousarray(values).view(f"<u{values.dtype.itemsize}").astype(np.uint64)
        strides = np.cumprod((1, *shape[:0:-1]), dtype=np.uint64)[::-1] if shape else np.zeros(0, np.uint64)
        flat = np.zeros(values.shape, dtype=np.uint64)
        for axis, (start, size) in enumerate(zip(starts, values.shape)):
            along = (np.arange(start, start + size, dtype=np.uint64) * strides[axis])
            flat += along.reshape([size if a == axis else 1 for a in range(values.ndim)])
        base = _mix(flat * np.uint64(0x9E3779B97F4A7C15) + bits).ravel()
        return np.array([_mix(base ^ lane).sum(dtype=np.uint64) for lane in _LANES], dtype=np.uint64)


def _leaf_sums(leaf: Any) -> np.ndarray:
    """This process's lane sums of ``leaf``: over the shards it holds whose ``replica_id`` is 0 (each element once
    over all processes), a chunk of rows at a time."""
    shape = tuple(int(d) for d in leaf.shape)
    if isinstance(leaf, jax.Array):
        pieces = [(shard.data, tuple(s.start or 0 for s in shard.index) if shard.index else ())
                  for shard in leaf.addressable_shards if shard.replica_id == 0]
    else:
        pieces = [(leaf, (0,) * len(shape))]
    total = np.zeros(len(_LANES), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for data, starts in pieces:
            values = np.asarray(data)
            if values.ndim == 0:
                total += _block_sums(values.reshape(()), (), shape)
                continue
            row = max(1, int(np.prod(values.shape[1:])))
            rows = max(1, _CHUNK // row)
            for first in range(0, values.shape[0], rows):
                block = values[first:first + rows]
                total += _block_sums(block, (starts[0] + first, *starts[1:]), shape)
    return total


def _sum_over_processes(sums: np.ndarray) -> np.ndarray:
    """Every process's ``sums`` (shape ``(leaves, lanes)``, uint64) added mod 2^64: an all-reduce.

    JAX without x64 carries no uint64, so each value travels as four 16-bit limbs in int32, whose sums over
    up to 32,767 processes cannot overflow; the limbs' sums are shifted back and added mod 2^64 here.
    Every process must call it (a collective); all get the same result.
    """
    limbs = np.stack([(sums >> np.uint64(16 * k)) & np.uint64(0xFFFF) for k in range(4)], axis=-1).astype(np.int32)
    totals = sum_over_processes(limbs).astype(np.uint64)
    with np.errstate(over="ignore"):
        return sum((totals[..., k] << np.uint64(16 * k) for k in range(4)), np.zeros_like(sums))


def tree_sha256(tree: Any) -> str:
    """Content hash of a pytree of arrays, independent of how a checkpoint lays it out and of the mesh.

    orbax/OCDBT file names and ``_CHECKPOINT_METADATA`` timestamps differ between identical runs, so the
    checkpoint manifest's root hash does too; this hash does not, nor does it change with the number of
    processes or how a leaf is sharded. For every leaf in tree order it covers the key path, dtype and shape and
    256 bits of content: four sums mod 2^64 over the leaf's elements of a mix of each element's index and raw
    bits (:func:`_block_sums`), so each process sums the shards it holds and the processes add their small
    records (one all-reduce of 32 bytes per leaf, :func:`_sum_over_processes`). It is a reproducibility
    fingerprint (equal bytes give equal hashes on any mesh), not a seal against a forger: the bucket's
    manifests and signatures are that.

    Returns:
        64 hex characters. In a multi-process run every process must call it (a collective); all return the same.
    """
    import hashlib

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = np.stack([_leaf_sums(leaf) for _, leaf in flat]) if flat else np.zeros((0, len(_LANES)), np.uint64)
    spread = np.array([isinstance(leaf, jax.Array) and not leaf.is_fully_addressable for _, leaf in flat], bool)
    if spread.any():  # the same on every process: the leaves' global structure decides
        sums = np.where(spread[:, None], _sum_over_processes(sums), sums)  # a leaf held whole is counted once
    digest = hashlib.sha256()
    for (path, leaf), leaf_sums in zip(flat, sums):
        shape = tuple(int(d) for d in leaf.shape)
        digest.update(f"{jax.tree_util.keystr(path)}|{np.dtype(leaf.dtype).str}|{shape}\n".encode())
        digest.update(leaf_sums.astype("<u8").tobytes())
    return digest.hexdigest()
