"""Multi-process start of the training entrypoint, driven only by the environment.

The pod specs (:mod:`tidal.launch.pods`) are the contract:

* multi-host TPU slices (and multislice) run as Indexed Jobs into which GKE's TPU webhook
  injects ``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES`` (and ``MEGASCALE_*`` for multislice);
  ``jax.distributed.initialize()`` then takes no arguments (JAX's GKE TPU cluster detection);
* multi-node GPU/CPU JobSets set ``JAX_COORDINATOR_ADDRESS`` (pod 0's stable hostname and
  port), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (the Job completion index); those are
  passed to ``jax.distributed.initialize`` explicitly.

Anything else is a single process and nothing is initialised. On the CPU backend the
cross-process collectives use gloo (``jax_cpu_collectives_implementation``), which is how
the tests run two local processes.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidal.settings import current

COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_PROCESS_ID"
TPU_HOSTS_ENV = "TPU_WORKER_HOSTNAMES"
MEGASCALE_ENV = "MEGASCALE_COORDINATOR_ADDRESS"

log = logging.getLogger("tidal.train")


class DistributedConfigError(ValueError):
    """The multi-process environment variables are inconsistent; the message names them."""


@dataclass(frozen=True)
class Launch:
    """How this process joins the run.

    Attributes:
        mode: ``"single"``, ``"tpu"`` (GKE TPU env, no-argument initialize) or ``"explicit"``.
        coordinator: ``host:port`` of process 0 (explicit mode).
        num_processes, process_id: the run's process count and this process's index.
    """

    mode: str
    coordinator: str | None = None
    num_processes: int = 1
    process_id: int = 0


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch:
    """Read how to start from the environment (see the module docstring).

    Raises:
        DistributedConfigError: ``JAX_NUM_PROCESSES`` > 1 without a coordinator or process id,
            non-integer values, or a process id outside ``[0, num_processes)``.
    """
    env = os.environ if env is None else env
    hosts = [h for h in env.get(TPU_HOSTS_ENV, "").split(",") if h.strip()]
    if len(hosts) > 1 or env.get(MEGASCALE_ENV):
        return Launch("tpu")
    raw = env.get(NUM_PROCESSES_ENV)
    if not raw:
        return Launch("single")
    try:
        num = int(raw)
        pid = int(env.get(PROCESS_ID_ENV, ""))
    except ValueError:
        raise DistributedConfigError(f"{NUM_PROCESSES_ENV}={raw!r} and {PROCESS_ID_ENV}="
                                     f"{env.get(PROCESS_ID_ENV)!r} must both be integers") from None
    if num == 1:
        return Launch("single")
    coordinator = env.get(COORDINATOR_ENV)
    if not coordinator:
        raise DistributedConfigError(f"{NUM_PROCESSES_ENV}={num} needs {COORDINATOR_ENV} (host:port of process 0)")
    if not 0 <= pid < num:
        raise DistributedConfigError(f"{PROCESS_ID_ENV}={pid} must be in [0, {NUM_PROCESSES_ENV}={num})")
    return Launch("explicit", coordinator, num, pid)


def initialize(env: Mapping[str, str] | None = None) -> Launch:
    """Join the multi-process run described by the environment (no-op for one process).

    Must run before any JAX backend is used. Returns the :class:`Launch` it acted on.
    """
    launch = launch_from_env(env)
    if launch.mode == "single":
        return launch
    import jax

    if launch.mode == "explicit":  # affects only the CPU client (GPU uses NCCL)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if launch.mode == "tpu":
        jax.distributed.initialize()
    else:
        # a process gone is seen within the heartbeat timeout (jax's default: 100 s), then every other
        # process is terminated by the coordination service
        jax.distributed.initialize(coordinator_address=launch.coordinator, num_processes=launch.num_processes,
                                   process_id=launch.process_id,
                                   heartbeat_timeout_seconds=current().train_peer_timeout_s)
    log.info("joined distributed run: process %d of %d (%s)", jax.process_index(), jax.process_count(),
             launch.mode)
    return launch


def is_primary() -> bool:
    """True in process 0, the only one that writes metrics, manifests and the summary."""
    import jax

    return jax.process_index() == 0


_STARTED = False


def start_once() -> None:
    """Join the multi-process run from the environment once per process (before any JAX use)."""
    global _STARTED
    if not _STARTED:
        initialize()
        _STARTED = True


def host_scalar(x: Any) -> float:
    """A replicated scalar as a Python float, also when it spans several processes."""
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return float(x)


@functools.cache
def _adder(mesh: Any) -> Any:
    """The jitted sum over ``mesh``'s process axis, replicated on every device: one per mesh, so a run's
    repeated all-reduces (each checkpoint's parameter hash) compile it once."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.jit(lambda rows: rows.sum(axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))


def sum_over_processes(values: Any) -> Any:
    """Every process's ``values`` (an int32 numpy array, the same shape on each) added elementwise: an
    all-reduce, so each process sends and receives records of that size only, never another's state.
    Every process must call it (a collective); all get the same result (int32: the caller keeps the sums
    within range).
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    values = np.asarray(values, np.int32)
    grid = np.array([[d for d in jax.devices() if d.process_index == p] for p in range(jax.process_count())])
    mesh = Mesh(grid, ("process", "device"))
    rows = jax.make_array_from_single_device_arrays(
        (grid.shape[0], *values.shape), NamedSharding(mesh, PartitionSpec("process")),
        [jax.device_put(values[None], d) for d in jax.local_devices()])
    return np.asarray(_adder(mesh)(rows).addressable_data(0))
