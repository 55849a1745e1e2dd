"""The device mesh of a training run and how the training state and batches are laid out on it.

Mesh axes (outermost first), as in MaxText/praxis:

* ``data``: pure data parallelism; parameters are replicated along it. By default it spans
  the TPU slices of a multislice run (one replica per slice, gradients reduced over DCN).
* ``fsdp``: data parallelism with parameters and optimizer state sharded along it
  (ZeRO-3 / FSDP, Rajbhandari et al. 2020): each array is split on its largest dimension
  that ``fsdp`` divides and gathered by XLA when a matmul needs it. By default it spans
  every device of a slice (or of the whole run on GPU/CPU).
* ``tensor``: Megatron-style tensor parallelism (Shoeybi et al. 2019): attention
  projections are split over heads and the MLP over ``d_ff``; 1 by default.

The batch dimension of every batch is sharded over ``("data", "fsdp")``, so the global batch
size must be a multiple of ``data * fsdp``. Everything here is a pure function of the mesh
shape, the parameter names and shapes, so every process computes the same layout.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# flax kernel names of the model (tidal.train.model): tensor-parallel along the output
# dimension (column-parallel) or the input dimension (row-parallel), Megatron-LM §3.
COLUMN_PARALLEL = ("w_q", "w_k", "w_v", "w_gate", "w_up")
ROW_PARALLEL = ("w_o", "w_down")
ATTENTION = ("w_q", "w_k", "w_v", "w_o")


class MeshError(ValueError):
    """A requested mesh does not fit the devices or the batch; the message names the rule."""


def slice_count(devices: Sequence[Any] | None = None) -> int:
    """Number of TPU slices among ``devices`` (``device.slice_index``), 1 on GPU/CPU."""
    devices = jax.devices() if devices is None else devices
    indices = {getattr(d, "slice_index", 0) for d in devices}
    return max(len(indices), 1)


def check_request(requested: Mapping[str, Any] | None) -> dict[str, int | None]:
    """Check the train config's ``mesh`` mapping: known axes, positive int or null sizes.

    Raises:
        MeshError: naming the unknown axis or the bad size.
    """
    if requested is None:
        return {}
    if not isinstance(requested, Mapping):
        raise MeshError(f"train config 'mesh' must map axis -> size, got {requested!r}")
    unknown = sorted(set(requested) - set(AXES))
    if unknown:
        raise MeshError(f"train config 'mesh': unknown axes {unknown}; axes are {list(AXES)}")
    for axis, size in requested.items():
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise MeshError(f"train config 'mesh.{axis}' must be a positive int or null, got {size!r}")
    return dict(requested)


def mesh_shape(n_devices: int, requested: Mapping[str, int | None] | None = None,
               n_slices: int = 1) -> dict[str, int]:
    """Sizes of the ``data``, ``fsdp`` and ``tensor`` axes for ``n_devices`` devices.

    Args:
        n_devices: total devices of the run (all processes).
        requested: explicit sizes from the train config's ``mesh``; a missing or ``None`` axis
            is derived: ``tensor`` 1, ``data`` = ``n_slices``, and ``fsdp`` takes the rest.
        n_slices: TPU slices (DCN-connected); the default ``data`` axis spans them.

    Returns:
        ``{"data": d, "fsdp": f, "tensor": t}`` with ``d * f * t == n_devices``.

    Raises:
        MeshError: a size below 1, or sizes whose product cannot equal ``n_devices``.
    """
    requested = check_request(requested)
    sizes = {axis: requested.get(axis) for axis in AXES}
    if sizes["tensor"] is None:
        sizes["tensor"] = 1
    if sizes["data"] is None:
        sizes["data"] = n_slices if sizes["fsdp"] is None else None
    free = [axis for axis, size in sizes.items() if size is None]
    fixed = math.prod(size for size in sizes.values() if size is not None)
    if free:
        if n_devices % fixed:
            raise MeshError(f"train config 'mesh' {requested}: the fixed axes ({fixed} devices) do not "
                            f"divide the {n_devices} devices of the run")
        sizes[free[0]] = n_devices // fixed
    if math.prod(sizes.values()) != n_devices:
        raise MeshError(f"train config 'mesh' {requested} -> {sizes}: data*fsdp*tensor must equal the "
                        f"{n_devices} devices of the run")
    return {axis: int(sizes[axis]) for axis in AXES}


def make_mesh(shape: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    """A :class:`jax.sharding.Mesh` of ``shape`` over ``devices`` (default: all devices).

    Uses ``mesh_utils.create_device_mesh`` (ICI-topology-aware device order on TPU and GPU)
    and, for several TPU slices, ``create_hybrid_device_mesh`` with ``data`` over DCN.
    Falls back to the plain device order where those refuse the shape (e.g. CPU).
    """
    from jax.experimental import mesh_utils

    devices = list(jax.devices() if devices is None else devices)
    dims = tuple(shape[axis] for axis in AXES)
    n_slices = slice_count(devices)
    try:
        if n_slices > 1 and shape["data"] % n_slices == 0:
            ici = (shape["data"] // n_slices, shape["fsdp"], shape["tensor"])
            grid = mesh_utils.create_hybrid_device_mesh(ici, (n_slices, 1, 1), devices)
        else:
            grid = mesh_utils.create_device_mesh(dims, devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.array(devices, dtype=object).reshape(dims)
    return Mesh(grid, AXES)


def _names(path: str) -> list[str]:
    return [part for part in path.replace("'", " ").replace("[", " ").replace("]", " ").replace(".", " ").split()]


def param_spec(path: str, shape: Sequence[int], sizes: Mapping[str, int],
               heads: Sequence[int] = ()) -> PartitionSpec:
    """The :class:`PartitionSpec` of one parameter (or optimizer-moment) array.

    Rules, applied in order:

    1. ``tensor``: a column-parallel kernel (``w_q``, ``w_k``, ``w_v``, ``w_gate``, ``w_up``)
       is split on its last dimension, a row-parallel one (``w_o``, ``w_down``) on its first,
       when ``tensor`` divides that dimension and, for attention, every head count in
       ``heads`` (so a head is never cut); otherwise it is replicated along ``tensor``.
    2. ``fsdp``: the largest remaining dimension that ``fsdp`` divides (the first on ties);
       none: replicated along ``fsdp``.
    3. arrays of rank < 2 (norm scales, step counters) are replicated.

    Args:
        path: the leaf's key path (``jax.tree_util.keystr``), e.g. ``['block_0']['attn']['w_q']['kernel']``.
        shape: the array shape.
        sizes: mesh axis sizes.
        heads: attention head counts (query heads, key/value heads) for the divisibility rule.
    """
    spec: list[str | None] = [None] * len(shape)
    if len(shape) < 2:
        return PartitionSpec(*spec)
    names = set(_names(path))
    t, f = sizes.get("tensor", 1), sizes.get("fsdp", 1)
    if t > 1:
        dim = len(shape) - 1 if names & set(COLUMN_PARALLEL) else 0 if names & set(ROW_PARALLEL) else None
        heads_ok = not (names & set(ATTENTION)) or all(h % t == 0 for h in heads)
        if dim is not None and heads_ok and shape[dim] % t == 0:
            spec[dim] = "tensor"
    if f > 1:
        free = [i for i in range(len(shape)) if spec[i] is None and shape[i] % f == 0]
        if free:
            spec[max(free, key=lambda i: (shape[i], -i))] = "fsdp"
    return PartitionSpec(*spec)


def state_shardings(abstract_state: Any, mesh: Mesh, heads: Sequence[int] = ()) -> Any:
    """:class:`NamedSharding` for every leaf of a (params, optimizer state) pytree.

    Optimizer moments live under paths that end with the parameter's own path (optax's
    ``mu``/``nu`` mirror the parameter tree), so they get the parameter's layout.
    """
    sizes = dict(mesh.shape)

    def one(path, leaf):
        return NamedSharding(mesh, param_spec(jax.tree_util.keystr(path), leaf.shape, sizes, heads))

    return jax.tree_util.tree_map_with_path(one, abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Layout of a ``[B, S]`` token batch: rows over ``("data", "fsdp")``, replicated over ``tensor``."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated layout (scalars, small eval batches)."""
    return NamedSharding(mesh, PartitionSpec())


def check_batch(batch_size: int, mesh: Mesh) -> None:
    """Raise :class:`MeshError` unless ``data * fsdp`` divides the global ``batch_size``."""
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % rows:
        raise MeshError(f"train config 'batch_size' ({batch_size}) must be a multiple of mesh data*fsdp "
                        f"({mesh.shape['data']}*{mesh.shape['fsdp']}={rows}): each batch row lives on one "
                        "data-parallel shard")


def process_rows(sharding: NamedSharding, batch_size: int) -> slice:
    """The rows of a ``[batch_size, S]`` batch laid out by ``sharding`` that this process's devices
    hold: one contiguous range (rows go over ``data x fsdp`` in device order, and a process's devices
    are consecutive in the mesh); all rows when its devices' rows are not one range.
    """
    spans = {(index[0].start or 0, batch_size if index[0].stop is None else index[0].stop)
             for index in sharding.addressable_devices_indices_map((batch_size, 1)).values()}
    start, stop = min(s for s, _ in spans), max(e for _, e in spans)
    covered = sorted(spans)
    contiguous = covered[0][0] == start and all(a[1] >= b[0] for a, b in itertools.pairwise(covered))
    return slice(start, stop) if contiguous else slice(0, batch_size)


def put_global(array: np.ndarray, sharding: NamedSharding, batch_size: int | None = None) -> jax.Array:
    """A global :class:`jax.Array` from this process's rows of it.

    ``array`` is the whole host array, or (``batch_size`` given and larger than ``array``) only the
    rows :func:`process_rows` names, which each process of a multi-host run reads for itself; the
    global array is then assembled with ``jax.make_array_from_process_local_data``. With the whole
    array, each process copies only the slices its own devices need.
    """
    if jax.process_count() == 1:  # one process holds every device: one transfer call
        return jax.device_put(array, sharding)
    if batch_size is not None and array.shape[0] < batch_size:
        return jax.make_array_from_process_local_data(sharding, array, (batch_size, *array.shape[1:]))
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def describe(mesh: Mesh) -> str:
    """``"data=1 fsdp=4 tensor=1 (4 devices, 1 process)"``."""
    sizes = " ".join(f"{axis}={mesh.shape[axis]}" for axis in AXES)
    return f"{sizes} ({mesh.devices.size} devices, {jax.process_count()} process(es), pid {os.getpid()})"
