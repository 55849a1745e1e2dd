"""Kernel-enforced limits of the test cluster's nodes (tests/cluster/harness.py): a cgroup v1 memory
limit (a process over it is OOM-killed: exit 137), a cgroup v1 CPU quota (CFS bandwidth), and the size
of each private tmpfs (``mount -o size=``, applied by the node's bootstrap).

Layout: one parent cgroup per cluster, ``tidal-<cluster id>``, in each controller's hierarchy, under the
cgroup the test process itself is in (so the nodes stay inside whatever limits the machine puts on the
test run); under it one cgroup per node boot, ``<node>-<n>``. The node's first process joins it before it
execs ``unshare`` (:meth:`NodeCgroup.join`), so every process of the node is in it; it is removed when
the node's processes are gone (:meth:`NodeCgroup.finish`, which records the boot's :class:`NodeUsage`),
and the parent at ``Cluster.stop`` (:meth:`Cgroups.remove`).

Where a controller is unavailable (not root, no cgroup v1 hierarchy, mkdir refused), that limit is skipped
and :attr:`Cgroups.skipped` says why; under ``CI=true`` the cluster refuses to start instead
(``ClusterUnavailable``), as for missing namespaces.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu")
CFS_PERIOD_US = 100_000
MIB = 1 << 20


@dataclass(frozen=True)
class NodeLimits:
    """What a node may use. The defaults are the training pod's own limits in tidal's pod spec, which
    this 2-core, 24 GiB machine can give every node, so every existing cluster test (Beam jobs, JAX
    training, Airflow Celery workers at concurrency 2, a Flink TaskManager of 1 GiB with its SDK
    worker pool) runs under them unchanged:

    Attributes:
        memory_mb: the memory cgroup's limit (``memory.limit_in_bytes``; with swap, also
            ``memory.memsw.limit_in_bytes``). Default 8192: ``LaunchConfig.memory = "8Gi"``
            (tidal/launch/config.py), the pod's memory request = limit. The node's tmpfs pages are
            charged to it too, as a ``medium: Memory`` emptyDir's are to a pod.
        cpus: the CPU quota in cores (``cpu.cfs_quota_us`` over a ``cpu.cfs_period_us`` of 100 ms).
            Default 2.0: ``LaunchConfig.cpu = "2"``, the pod's CPU request (all of this machine's cores:
            the quota never throttles a default node here).
        tmpfs_mb: the size of each private tmpfs (/tmp, /var/tmp, /dev/shm, /var/cache, ~/.cache,
            ~/.config): past it a write fails with ENOSPC. Default 10240: ``TMP_SIZE = "10Gi"``
            (tidal/launch/pods.py), the pod's /tmp emptyDir ``sizeLimit``.
    """

    memory_mb: int = 8192
    cpus: float = 2.0
    tmpfs_mb: int = 10240

    def __post_init__(self) -> None:
        if not (isinstance(self.memory_mb, int) and self.memory_mb >= 16):
            raise ValueError(f"memory_mb must be an int >= 16 (MiB), not {self.memory_mb!r}")
        if not self.cpus > 0:
            raise ValueError(f"cpus must be > 0, not {self.cpus!r}")
        if not (isinstance(self.tmpfs_mb, int) and self.tmpfs_mb >= 1):
            raise ValueError(f"tmpfs_mb must be an int >= 1 (MiB), not {self.tmpfs_mb!r}")


@dataclass(frozen=True)
class NodeUsage:
    """What one boot of a node used, read from its cgroup when its processes were gone.

    Attributes:
        node: the node's name; cgroup: its cgroup's name (``<node>-<n>``).
        limits: the limits it ran under; enforced: the controllers that enforced them (the others were
            skipped: see ``Cluster.limits_skipped``).
        peak_bytes: ``memory.max_usage_in_bytes`` (None without the memory controller).
        failcnt: ``memory.failcnt``, how often usage hit the limit (reclaim, then OOM).
        oom_kills: the ``oom_kill`` count of ``memory.oom_control``: processes the OOM killer killed.
        throttled_periods: ``nr_throttled`` of ``cpu.stat``: CFS periods in which the quota stopped it.
    """

    node: str
    cgroup: str
    limits: NodeLimits
    enforced: tuple[str, ...]
    peak_bytes: int | None = None
    failcnt: int | None = None
    oom_kills: int | None = None
    throttled_periods: int | None = None

    @property
    def oom_killed(self) -> bool:
        return bool(self.oom_kills)

    @property
    def peak_mb(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / MIB

    def describe(self) -> str:
        """One line: 'node x: OOM-killed at limit 256 MiB, peak 256.0 MiB (...)' or its peak of its limit."""
        if "memory" not in self.enforced:
            return f"node {self.node}: no memory limit enforced (no memory cgroup)"
        peak = f"peak {self.peak_mb:.1f} MiB"
        if self.oom_killed:
            return (f"node {self.node}: OOM-killed at limit {self.limits.memory_mb} MiB, {peak} "
                    f"({self.oom_kills} process(es) killed, limit hit {self.failcnt} times)")
        return f"node {self.node}: {peak} of its {self.limits.memory_mb} MiB limit"


def _own_cgroup(controller: str) -> str:
    """The test process's cgroup path in ``controller``'s v1 hierarchy ('/' when not listed)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    return "/"


def _parent_dir(controller: str, name: str) -> tuple[Path | None, str | None]:
    """Where the cluster's parent cgroup ``name`` goes in ``controller``'s hierarchy, or why it cannot."""
    if os.geteuid() != 0:
        return None, "cgroups need root"
    mount = CGROUP_ROOT / controller
    probe = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us"}[controller]
    if not (mount / probe).exists():
        return None, f"no cgroup v1 {controller} controller mounted at {mount} (no {probe})"
    own = mount / _own_cgroup(controller).lstrip("/")
    base = own if (own / probe).exists() else mount  # a container without a cgroup namespace: its root
    return base / name, None


class Cgroups:
    """The cluster's parent cgroups (``tidal-<cluster id>`` per controller) and its nodes' cgroups.

    Attributes:
        parents: controller -> the parent cgroup's folder, for each controller in use.
        skipped: controller -> why its limit is not enforced on this machine.
        usage: every finished node boot's :class:`NodeUsage`, in the order they finished.
    """

    def __init__(self, cluster_id: str):
        self.name = f"tidal-{cluster_id}"
        self.parents: dict[str, Path] = {}
        self.skipped: dict[str, str] = {}
        self.usage: list[NodeUsage] = []
        self._count = 0
        self._live: list[NodeCgroup] = []
        self._lock = threading.Lock()
        for controller in CONTROLLERS:
            path, reason = _parent_dir(controller, self.name)
            if path is not None:
                try:
                    path.mkdir()
                except OSError as err:
                    reason = f"cannot create the {controller} cgroup {path}: {err}"
                else:
                    self.parents[controller] = path
                    continue
            self.skipped[controller] = reason or "unavailable"

    def node(self, name: str, limits: NodeLimits) -> NodeCgroup:
        """A new cgroup for one boot of node ``name``, its limits written."""
        with self._lock:
            self._count += 1
            cgroup = NodeCgroup(self, f"{name}-{self._count}", name, limits)
            self._live.append(cgroup)
        return cgroup

    def _done(self, cgroup: NodeCgroup, usage: NodeUsage) -> None:
        with self._lock:
            self.usage.append(usage)
            with contextlib.suppress(ValueError):
                self._live.remove(cgroup)

    def remove(self) -> None:
        """Finish every node cgroup still there (SIGKILL to what is left in it), then remove the parents."""
        with self._lock:
            live = list(self._live)
        for cgroup in live:
            cgroup.finish(grace_s=0)
        for controller, path in list(self.parents.items()):
            for child in path.iterdir() if path.is_dir() else ():
                if child.is_dir():
                    _rmdir(child)
            if _rmdir(path):
                del self.parents[controller]


def _rmdir(path: Path, wait_s: float = 10) -> bool:
    """Remove cgroup ``path``, retrying for ``wait_s`` while it is busy; whether it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: a process that is dying is still in it
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


class NodeCgroup:
    """One boot's cgroup in each available controller, created with its limits."""

    def __init__(self, owner: Cgroups, cgroup: str, node: str, limits: NodeLimits):
        self.owner, self.name, self.node, self.limits = owner, cgroup, node, limits
        self.paths = {c: parent / cgroup for c, parent in owner.parents.items()}
        self.usage: NodeUsage | None = None
        self._lock = threading.Lock()
        self._created = time.monotonic()
        for controller, path in self.paths.items():
            path.mkdir()
            if controller == "memory":
                limit = limits.memory_mb * MIB
                (path / "memory.limit_in_bytes").write_text(str(limit))
                memsw = path / "memory.memsw.limit_in_bytes"  # with swap: swapping out does not dodge it
                if memsw.exists():
                    with contextlib.suppress(OSError):
                        memsw.write_text(str(limit))
            else:
                (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(limits.cpus * CFS_PERIOD_US))))

    def join(self, argv: list[str]) -> list[str]:
        """``argv`` run by a ``sh`` that first moves itself into this cgroup (then execs ``argv``), so
        every process the node starts is in it; exit 125 when it cannot."""
        if not self.paths:
            return argv
        q = shlex.quote
        moves = " && ".join(f"echo $$ > {q(str(p / 'cgroup.procs'))}" for p in self.paths.values())
        script = (f"{{ {moves}; }} || {{ echo 'cluster node {self.node}: cannot join cgroup {self.name}' >&2; "
                  'exit 125; }\nexec "$@"')
        return ["sh", "-c", script, f"cgroup:{self.name}", *argv]

    def pids(self) -> list[int]:
        """The processes in this cgroup now (the memory controller's, else the CPU's)."""
        pids: set[int] = set()
        for path in self.paths.values():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return sorted(pids)

    def wait_until_done(self, pid: int) -> NodeUsage:
        """Wait until process ``pid`` (the node's first process, booted in the background) has exited, without
        reaping it (a pidfd: its Popen stays its owner's), then :meth:`finish`."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already gone
            fd = None
        if fd is not None:
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
        return self.finish(grace_s=10)

    def finish(self, grace_s: float = 10) -> NodeUsage:
        """Wait up to ``grace_s`` for the node's processes to be gone (its namespace's init has exited:
        the kernel kills the rest), SIGKILL what is left, record its :class:`NodeUsage` and remove the
        cgroup. Idempotent."""
        with self._lock:
            if self.usage is not None:
                return self.usage
            deadline = time.monotonic() + grace_s
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in self.pids():  # only this node's own processes are in its cgroup
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.usage = self._read()
            for path in self.paths.values():
                _rmdir(path)
        self.owner._done(self, self.usage)
        return self.usage

    def _read(self) -> NodeUsage:
        def number(controller: str, file: str) -> int | None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return int((self.paths[controller] / file).read_text().strip())
            return None

        def field(controller: str, file: str, key: str) -> int | None:
            with contextlib.suppress(OSError, KeyError):
                for line in (self.paths[controller] / file).read_text().splitlines():
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
            return None

        return NodeUsage(node=self.node, cgroup=self.name, limits=self.limits, enforced=tuple(self.paths),
                         peak_bytes=number("memory", "memory.max_usage_in_bytes"),
                         failcnt=number("memory", "memory.failcnt"),
                         oom_kills=field("memory", "memory.oom_control", "oom_kill"),
                         throttled_periods=field("cpu", "cpu.stat", "nr_throttled"))


__all__ = ["Cgroups", "NodeCgroup", "NodeLimits", "NodeUsage"]
