"""The packed checkpoint layout and tree layouts of training states (:mod:`tidal.train.checkpoints`).

Packed: ``{"packed": {dtype: 1-D array}}``, every leaf of that dtype concatenated in tree order,
with the leaves' ``[key path, shape, dtype]`` list in the checkpoint's orbax custom metadata
(:data:`PACKED_KEY`, covered by the manifest's hashes like every file). Used for a ``host_state`` save of
up to :data:`PACK_MAX_BYTES`: orbax spends ~2 ms of Python CPU per array and ~45 ms per save whatever the
size, so the bench model's 65 leaves cost ~240 ms of CPU per save as a tree and ~90 ms packed, CPU that a
CPU-only host takes from the training step. A packed checkpoint restores into a multi-process run too:
every process reads the packed arrays whole (plain numpy, at most :data:`PACK_MAX_BYTES`) and places only
its addressable shards (:func:`unpack_state`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# largest host_state saved packed: the packing copy costs host memory and memcpy time, and
# above this size per-array overheads are small next to the bytes written
PACK_MAX_BYTES = 512 * 2**20
PACKED_KEY = "tidal_packed"


def _path_key(path: Any) -> str:
    """``opt_state/1/0/mu/w``: a key path written the same for dicts, namedtuples and lists
    (orbax stores namedtuples as dicts and tuples as lists)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def tree_layout(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{path: (shape, dtype)}`` of every array leaf (arrays, ShapeDtypeStructs or orbax metadata)."""
    return {_path_key(path): (tuple(int(d) for d in leaf.shape), str(leaf.dtype))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(leaf, "shape")}


def layout_problems(saved: dict, wanted: dict, limit: int = 5) -> list[str]:
    """Differences between two :func:`tree_layout` results, at most ``limit`` lines."""
    out = [f"{k}: in checkpoint, not in model" for k in sorted(set(saved) - set(wanted))]
    out += [f"{k}: in model, not in checkpoint" for k in sorted(set(wanted) - set(saved))]
    out += [f"{k}: checkpoint {saved[k][1]}{list(saved[k][0])} vs model {wanted[k][1]}{list(wanted[k][0])}"
            for k in sorted(set(saved) & set(wanted)) if saved[k] != wanted[k]]
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def pack_state(state: Any, max_bytes: int = PACK_MAX_BYTES) -> tuple[dict, dict] | None:
    """The packed layout of ``state`` (module docstring): ``(item, custom_metadata)``.

    Returns None (save as a tree) when a leaf is not a numeric array (e.g. a typed PRNG
    key, a Python scalar), key paths collide, the state is empty or over ``max_bytes``.
    Reads every leaf into host memory (a view for CPU arrays; the packed copy is new).
    """
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    if not flat:
        return None
    leaves, parts, total = [], {}, 0
    for path, leaf in flat:
        if not isinstance(leaf, jax.Array | np.ndarray) or jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return None
        total += leaf.nbytes
        if total > max_bytes:
            return None
        leaves.append([_path_key(path), [int(d) for d in leaf.shape], str(leaf.dtype)])
        parts.setdefault(str(leaf.dtype), []).append(np.asarray(leaf).reshape(-1))
    if len({key for key, _, _ in leaves}) != len(leaves):
        return None
    return {"packed": {dtype: np.concatenate(arrays) for dtype, arrays in parts.items()}}, {PACKED_KEY: leaves}


def split_packed(packed: dict[str, np.ndarray], leaves: list) -> dict[str, np.ndarray]:
    """``{key path: array}`` of a packed checkpoint: each leaf cut from its dtype's array at
    the offset the leaf list implies (views, no copies).

    Raises:
        ValueError: the arrays do not hold exactly the listed leaves.
    """
    pieces, offsets = {}, dict.fromkeys(packed, 0)
    for key, shape, dtype in leaves:
        size = int(np.prod(shape, dtype=np.int64))
        if dtype not in packed or offsets[dtype] + size > packed[dtype].size:
            raise ValueError(f"packed checkpoint has no room for leaf {key} ({dtype}{shape})")
        pieces[key] = packed[dtype][offsets[dtype]:offsets[dtype] + size].reshape(shape)
        offsets[dtype] += size
    if any(offsets[dtype] != array.size for dtype, array in packed.items()):
        raise ValueError(f"packed checkpoint arrays hold more than its {len(leaves)} listed leaves")
    return pieces


def unpack_state(packed: dict[str, np.ndarray], leaves: list, abstract_state: Any) -> Any:
    """Rebuild ``abstract_state``'s tree from a packed checkpoint's arrays and leaf list.

    Each leaf (:func:`split_packed`) is placed with the abstract leaf's sharding
    (``jax.make_array_from_callback``: each device, of any process, takes its slice); the
    caller has checked that the layouts match.
    """
    pieces = split_packed(packed, leaves)

    def place(path: Any, leaf: Any) -> jax.Array:
        piece = pieces[_path_key(path)]
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            return jax.device_put(piece)
        return jax.make_array_from_callback(piece.shape, sharding, lambda index: piece[index])

    return jax.tree_util.tree_map_with_path(place, abstract_state)
