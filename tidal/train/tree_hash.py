"""A content hash of a pytree of arrays that does not depend on how a checkpoint lays it out."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tidal.train.distributed import host_blocks


def tree_sha256(tree: Any) -> str:
    """Content hash of a pytree of arrays, independent of how a checkpoint lays it out on disk.

    orbax/OCDBT file names and ``_CHECKPOINT_METADATA`` timestamps differ between identical
    runs, so the checkpoint manifest's root hash does too; this hash does not. It covers,
    for every leaf in tree order, its key path, dtype, shape and raw bytes (host copy). In a
    multi-process run every process calls it: a leaf spread over processes is gathered a block of
    rows at a time (:func:`tidal.train.distributed.host_blocks`: a host holds one block, never a leaf).
    """
    import hashlib

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = tuple(int(d) for d in leaf.shape)
        digest.update(f"{jax.tree_util.keystr(path)}|{np.dtype(leaf.dtype).str}|{shape}\n".encode())
        for block in host_blocks(leaf):  # the leaf's bytes in C order, a block of rows at a time
            digest.update(np.ascontiguousarray(block).tobytes())
    return digest.hexdigest()
