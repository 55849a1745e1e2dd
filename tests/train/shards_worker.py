"""One process of a multi-process sharded checkpoint run (tests/train/test_shards.py, bench/checkpoint_scale.py).

``python -m tests.train.shards_worker MODE LOCATION STEP FSDP TENSOR [SCALE]`` under the pod env contract
(``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``; or none: one process):

* ``save``: build the state on a global ``FSDP x TENSOR`` mesh and save it as checkpoint ``STEP`` through
  :class:`tidal.train.checkpoints.Checkpointer` with ``LOCATION`` as its mirror (sharded when multi-process);
* ``restore``: restore the newest checkpoint into this run's mesh and check every addressable shard against
  the values the state is built from, bit for bit;
* ``lose``: like ``save``, but the last process exits before saving (a node lost mid-save).

The state's values are a function of the leaf and the global index only, so any process on any mesh
knows what every shard must hold. ``SCALE`` multiplies the leaves' first dimension (the bench's size).
Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from typing import Self

from tidal.train.distributed import start_once

start_once()

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tidal.train.checkpoints import Checkpointer, CheckpointSaveFailed
from tidal.train.shard_arrays import addressable_bytes

# leaf -> (shape with the scaled first dim, dtype, partition over ("fsdp", "tensor"))
LEAVES = {
    "params/embed": ((64, 32), "float32", P("fsdp", "tensor")),
    "params/w": ((64, 48), "float32", P("fsdp", "tensor")),
    "params/b": ((48,), "bfloat16", P()),
    "opt_state/mu/embed": ((64, 32), "float32", P("fsdp", "tensor")),
    "opt_state/nu/zero": ((16,), "float32", P("tensor")),  # all zeros: written, not elided
    "opt_state/count": ((), "int32", P()),
}


def shapes(scale: int) -> dict[str, tuple[tuple[int, ...], str, P]]:
    return {k: ((s[0] * scale, *s[1:]) if s and k != "params/b" and "zero" not in k else s, d, p)
            for k, (s, d, p) in LEAVES.items()}


def shard_value(name: str, shape: tuple[int, ...], dtype: str, index: tuple[slice, ...] = ()) -> np.ndarray:
    """The values of ``index`` of a leaf, computed for that slice only and a block of rows at a time (no
    process builds a whole leaf, nor a temporary larger than a block): ``(flat position mod 2**20) / 1024
    + a seed of the name``, zeros for the ``zero`` leaf."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    ranges = [np.arange(*sl.indices(dim)) for sl, dim in zip(index, shape, strict=True)]
    out = np.zeros(tuple(len(r) for r in ranges), dtype)
    if "zero" in name:
        return out
    seed = sum(map(ord, name))
    if not shape:
        out[()] = seed
        return out
    strides = [int(np.prod(shape[axis + 1:])) for axis in range(len(shape))]
    inner = np.zeros(out.shape[1:], np.int64)
    for axis in range(1, len(shape)):
        view = [1] * (len(shape) - 1)
        view[axis - 1] = -1
        inner = inner + ranges[axis].reshape(view) * strides[axis]
    block = max(1, 2**20 // max(1, inner.size))  # rows at a time: the temporaries stay ~8 MiB
    for start in range(0, len(ranges[0]), block):
        rows = ranges[0][start:start + block].reshape((-1,) + (1,) * inner.ndim)
        out[start:start + block] = ((rows * strides[0] + inner) % 2**20 / 1024 + seed).astype(dtype)
    return out


def nest(flat: dict[str, object]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, last = key.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def build(mesh: Mesh, scale: int, abstract: bool = False) -> dict:
    leaves = {}
    for name, (shape, dtype, spec) in shapes(scale).items():
        sharding = NamedSharding(mesh, spec)
        if abstract:
            leaves[name] = jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)
        else:
            leaves[name] = jax.make_array_from_callback(
                shape, sharding, lambda index, n=name, s=shape, d=dtype: shard_value(n, s, d, index))
    return nest(leaves)


def _rss() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The largest resident memory of this process while the ``with`` block runs (sampled every 5 ms)."""

    def __enter__(self) -> Self:
        import threading

        self.peak, self._stop = _rss(), threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, _rss())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _device_bytes(state: dict) -> int:
    """Bytes of this process's device arrays of ``state``, every device's shard (replicas each count): HBM on
    a TPU or GPU host, host memory on the CPU backend."""
    return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state) for shard in leaf.addressable_shards)


def _raw_put(location: str, state: dict, process: int) -> float:
    """Seconds to PUT this process's shards of ``state`` with the store's own client (boto3 for s3://,
    google-cloud-storage for gs://), as many at a time as a save writes."""
    from concurrent.futures import ThreadPoolExecutor

    from tidal.storage import gcs, uris
    from tidal.train.shard_arrays import copy_to_host

    host = copy_to_host(state, copy=False)
    bucket, key = uris.split(uris.join(location, "raw-put", str(process)))
    if uris.on_gcs(location):
        into = gcs.client().bucket(bucket)

        def put(item: tuple[int, tuple]) -> None:
            into.blob(f"{key}/{item[0]}").upload_from_string(np.require(item[1][3], requirements="C").tobytes())
    else:
        client = uris.client_for(location)

        def put(item: tuple[int, tuple]) -> None:
            client.put_object(Bucket=bucket, Key=f"{key}/{item[0]}",
                              Body=np.require(item[1][3], requirements="C").tobytes())
    put((-1, (None, None, None, np.zeros(1, np.uint8))))  # the client's connection made before the clock starts
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(put, enumerate(host.shards)))
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    mode, location, step, fsdp, tensor = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    scale = int(argv[5]) if len(argv) > 5 else 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s",
                        force=True)
    logging.getLogger("tidal").setLevel(logging.INFO)
    mesh = Mesh(np.array(jax.devices()).reshape(fsdp, tensor), ("fsdp", "tensor"))
    here, count = jax.process_index(), jax.process_count()
    workdir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"shards-worker-{os.getpid()}")
    ckpt = Checkpointer(workdir, keep=2, primary=here == 0, mirror=location, host_state=True,
                        commit_wait_s=float(os.environ.get("SHARDS_COMMIT_WAIT_S", "600")))
    result: dict[str, object] = {"process": here, "processes": count, "mesh": [fsdp, tensor]}
    try:
        if mode in ("save", "lose"):
            result["rss_before_bytes"] = _rss()
            state = build(mesh, scale)
            if mode == "lose" and here == count - 1:
                print("LOST before saving", flush=True)
                os._exit(0)
            if count > 1 and mode == "save":  # the saves start together (processes start up at different speeds)
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("shards-worker-built")
            if os.environ.get("SHARDS_WARM_SAVE"):  # the bench times a later save, as training repeats them
                ckpt.save(step - 1, state)
                ckpt.wait()
            start = time.perf_counter()
            with PeakRss() as peak:
                ckpt.save(step, state)
                result["blocking_s"] = time.perf_counter() - start
                try:
                    manifest = ckpt.wait()
                except CheckpointSaveFailed as err:
                    print(f"error: {err}", flush=True)
                    os._exit(1)  # as the entrypoint does: no jax shutdown barrier with a peer gone
            result["save_s"] = time.perf_counter() - start
            result["peak_rss_in_save_bytes"] = peak.peak
            result["device_bytes"] = _device_bytes(state)
            result["root_hash"] = (manifest or {}).get("root_hash")
            result["own_bytes"] = ckpt.mirror.uploads[-1][1]
            if os.environ.get("SHARDS_RAW_PUT"):  # the bench's baseline: the same bytes, plain PUTs
                result["raw_put_s"] = _raw_put(location, state, here)
        else:
            result["rss_before_bytes"] = _rss()
            start = time.perf_counter()
            with PeakRss() as peak:
                restored = ckpt.restore_latest(build(mesh, scale, abstract=True))
            result["restore_s"] = time.perf_counter() - start
            result["peak_rss_in_restore_bytes"] = peak.peak
            result["rss_after_restore_bytes"] = _rss()
            result["device_bytes"] = 0 if restored is None else _device_bytes(restored[1])
            if restored is None:
                result["step"] = None
            else:
                got_step, state, manifest = restored
                wrong = []
                for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
                    name = "/".join(str(getattr(k, "key", k)) for k in path)
                    shape, dtype, _ = shapes(scale)[name]
                    if str(leaf.dtype) != dtype:
                        wrong.append(f"{name}: dtype {leaf.dtype}")
                    for shard in leaf.addressable_shards:
                        if not np.array_equal(np.asarray(shard.data), shard_value(name, shape, dtype, shard.index)):
                            wrong.append(f"{name}{shard.index}")
                result.update(step=got_step, wrong=wrong, root_hash=manifest.get("root_hash"),
                              read_bytes=addressable_bytes(state))
    finally:
        ckpt._worker.shutdown(wait=False)
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(result), flush=True)
    if count > 1:  # all done, then out without jax's shutdown; process 0 (the coordinator) last
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("shards-worker-done")
        if here == 0:
            time.sleep(1.0)
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
