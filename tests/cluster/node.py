"""A node of the share-nothing test cluster (tests/cluster/harness.py): each :meth:`Node.run` or
:meth:`Node.start` is a fresh boot in its own mount, UTS, IPC and PID namespaces inside the node's network
namespace, under its cgroup limits, with the cluster's bootstrap script as PID 1; and the errors and
helpers that stop a node's process tree. The cluster (:class:`tests.cluster.harness.Cluster`) owns what
nodes share: the services, the network, the image, the hosts files and the cgroups.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tests.cluster.limits import NodeCgroup, NodeLimits, NodeUsage
from tests.cluster.network import network_unavailable

if TYPE_CHECKING:
    from tests.cluster.harness import Cluster

UNSHARE = ["unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc",
           "--propagation", "private"]
TAIL_CHARS = 4000


class NodeError(subprocess.CalledProcessError):
    """A node's command exited non-zero (``run(check=True)``); the message carries its output's tail and,
    when the OOM killer struck, the node's memory limit and peak (``usage``: its :class:`NodeUsage`)."""

    usage: NodeUsage | None = None

    def __str__(self) -> str:
        oom = f" ({self.usage.describe()})" if self.usage is not None and self.usage.oom_killed else ""
        return f"{super().__str__()}{oom}\n{_tail(self.stdout, self.stderr)}"


class NodeTimeout(subprocess.TimeoutExpired):
    """A node's command ran past its timeout and the node was killed; the message carries its output's tail."""

    usage: NodeUsage | None = None

    def __str__(self) -> str:
        return f"{super().__str__()} (the node was killed)\n{_tail(self.stdout, self.stderr)}"


class NodeResult(subprocess.CompletedProcess):
    """A finished :meth:`Node.run`: a CompletedProcess with ``usage``, the boot's :class:`NodeUsage`."""

    def __init__(self, args, returncode, stdout, stderr, usage: NodeUsage):
        super().__init__(args, returncode, stdout, stderr)
        self.usage = usage


def _tail(stdout: str | None, stderr: str | None) -> str:
    return (f"--- stdout (tail) ---\n{(stdout or '')[-TAIL_CHARS:]}\n"
            f"--- stderr (tail) ---\n{(stderr or '')[-TAIL_CHARS:]}")


def namespaces_unavailable() -> str | None:
    """Why this machine cannot create a node's namespaces, or None when it can (tries ``unshare`` once)."""
    if os.geteuid() != 0:
        return "the test cluster needs root (mount, UTS, IPC and PID namespaces, tmpfs mounts, cgroups)"
    if shutil.which("unshare") is None:
        return "the test cluster needs util-linux's unshare, which is not on PATH"
    try:
        probe = subprocess.run([*UNSHARE, "true"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare failed: {err}"
    if probe.returncode != 0:
        return f"unshare --mount --uts --ipc --pid --fork failed ({probe.returncode}): {probe.stderr.strip()}"
    return network_unavailable()


def _die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` under ``setpriv --pdeathsig KILL`` where there is setpriv: it dies if the test process does."""
    return ["setpriv", "--pdeathsig", "KILL", *argv] if shutil.which("setpriv") else argv


def stop_node(proc: subprocess.Popen, *, kill: bool = False) -> None:
    """Stop a node :meth:`Node.start` booted: SIGTERM with a 10 s grace, or at once SIGKILL of its
    whole process tree (``kill=True``: the machine is lost)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return
    _stop_group(proc)


def _stop_group(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL after ``grace_s`` seconds, then reap it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.poll()


def bootstrap_script(name: str, env: Mapping[str, str], limits: NodeLimits, *, hosts_file: Path,
                     keep: Sequence[tuple[Path, Path]], read_only: bool, storage_cache: str) -> str:
    """The bash script a node runs as its PID 1 around ``"$@"`` (its command) in environment ``env``: its
    hostname, ``hosts_file`` over /etc/hosts, a private tmpfs of ``limits.tmpfs_mb`` over every scratch place,
    the rest of the disk read-only (``read_only``), and each ``(source, path)`` of ``keep`` (plus the corpora
    and tools caches) bound read-only at ``path`` through the tmpfs mounts. It exits with the command's status,
    or 125 if the node's own set-up failed."""
    home = Path(env.get("HOME") or Path.home())
    archives = Path(env.get("TIDAL_ARCHIVE_CACHE") or home / ".cache" / "tidal" / "archives")
    private = ["/tmp", "/var/tmp", "/dev/shm", "/var/cache", str(home / ".cache"), str(home / ".config")]
    q = shlex.quote
    lines = [
        "set -eEuo pipefail",
        f"trap 'echo \"cluster node {name}: bootstrap failed: $BASH_COMMAND\" >&2; exit 125' ERR",
        f"hostname {q(name)}",
        f"mount --bind {q(str(hosts_file))} /etc/hosts",
        "mount -o remount,bind,ro /etc/hosts",
        *(f"mkdir -p {q(d)}" for d in private),  # before / may turn read-only
    ]
    # Kept visible, read-only, through the private tmpfs mounts: the corpora archive cache (under
    # ~/.cache), the tools cache and the shared folders, each at its own path; and the image
    # (tests/cluster/image.py) at the checkout's path, over the launcher's working tree. A handle
    # is taken first: the tmpfs hides the path.
    tools = Path(env.get("TIDAL_TOOLS_CACHE") or home / ".cache" / "tidal" / "tools")  # Flink, job server
    keep = [*((p, p) for p in (archives, tools) if p.is_dir()), *((s, p) for s, p in keep if s.is_dir())]
    for fd, (source, _) in enumerate(keep, start=3):
        lines.append(f"exec {fd}< {q(str(source))}")
    if read_only:
        lines.append("mount -o remount,bind,ro /")
    size = f",size={limits.tmpfs_mb}m"
    mode = {d: "1777" if d in ("/tmp", "/var/tmp", "/dev/shm") else "755" for d in private}  # re-mkdir: HOME=/tmp
    lines += [f"mkdir -p {q(d)} && mount -t tmpfs -o mode={mode[d]}{size} tmpfs {q(d)}" for d in private]
    for fd, (_, path) in enumerate(keep, start=3):
        lines += [f"mkdir -p {q(str(path))}",
                  f"mount --no-canonicalize --bind /proc/self/fd/{fd} {q(str(path))}",
                  f"mount -o remount,bind,ro {q(str(path))}",
                  f"exec {fd}<&-"]
    lines += [f"mkdir -p {q(storage_cache)} /tmp/work",
              "cd /tmp/work",
              "trap - ERR",
              "set +eEu +o pipefail",
              '"$@"',
              "exit $?"]
    return "\n".join(lines) + "\n"


class Node:
    """One named machine of the cluster; every :meth:`run` or :meth:`start` is a fresh boot (new
    namespaces, empty tmpfs).

    Attributes:
        address: the node's address on the cluster's bridge (:func:`node_address`), which its name resolves
            to on every node and the names in ``aliases`` on this node only (a pod's sidecar). A server on
            the node that binds ``127.0.0.1`` is reachable from this node alone.
    """

    def __init__(self, cluster: Cluster, name: str):
        self.cluster = cluster
        self.name = name
        self.address = cluster._addresses[name]

    @property
    def limits(self) -> NodeLimits:
        """The limits this node boots with (set by :meth:`Cluster.node`)."""
        return self.cluster.limits_of(self.name)

    def _boot(self, command: Sequence[str], env: Mapping[str, str] | None,
              inherit: bool = True) -> tuple[dict[str, str], list[str], NodeCgroup | None]:
        """The node's environment (:attr:`Cluster.env` updated with ``env``; ``env`` alone unless ``inherit``),
        the argv that boots it around ``command`` (its cgroup joined, new namespaces, the bootstrap script as
        PID 1) and its new cgroup."""
        node_env = {**(self.cluster.env if inherit else {}), **(env or {})}
        limits = self.limits
        argv = ["nsenter", f"--net={self.cluster.network.netns_path(self.name)}", *UNSHARE, "bash", "-c",
                self.cluster.bootstrap(self.name, node_env, limits), f"node:{self.name}", *command]
        cgroup = self.cluster._cgroups.node(self.name, limits) if self.cluster._cgroups else None
        return node_env, _die_with_parent(cgroup.join(argv) if cgroup else argv), cgroup

    def start(self, command: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
              inherit: bool = True) -> subprocess.Popen:
        """Boot the node and run ``command`` in the background (a long-running service: a Flink
        TaskManager, a worker pool), stdout and stderr to ``log``. Stop it by its process group
        (:func:`stop_node`): the node's namespace init dies and takes every process of the node along,
        as losing the machine would. Once its processes are gone, a watcher thread records the boot's
        :class:`NodeUsage` as the returned Popen's ``node_usage`` (None until then) and in
        :attr:`Cluster.usage`, and removes its cgroup. ``inherit=False``: the command's environment is ``env``
        alone, none of :attr:`Cluster.env` (a pod's container: the image's env and its spec's, see
        :meth:`Cluster.image_env`).
        """
        node_env, argv, cgroup = self._boot(command, env, inherit)
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen(argv, env=node_env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            if cgroup is not None:
                cgroup.finish(grace_s=0)
            raise
        proc.node_usage = None
        if cgroup is not None:
            def watch() -> None:
                proc.node_usage = cgroup.wait_until_done(proc.pid)

            threading.Thread(target=watch, name=f"cgroup-{cgroup.name}", daemon=True).start()
        return proc

    def run(self, command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
            check: bool = True, input: str | None = None) -> NodeResult:
        """Boot the node, run ``command`` in a fresh directory under its /tmp, and tear the node down.

        The command gets :attr:`Cluster.env` updated with ``env``, nothing else of the test process's
        environment. Output is captured as text. Safe to call from several threads at once (nodes run
        concurrently). The result's ``usage`` (:class:`NodeUsage`) has the boot's peak memory and OOM
        kills; so do the exceptions'. A command the OOM killer killed exits 137.

        Args:
            command: argv; the first word is looked up on the node's PATH.
            env: extra or overriding variables for this run.
            timeout: seconds before the node's whole process group is SIGKILLed.
            check: raise :class:`NodeError` on a non-zero exit.
            input: text written to the command's stdin (default: stdin is /dev/null).

        Raises:
            NodeTimeout: the command ran longer than ``timeout`` seconds (the node was killed).
            NodeError: ``check`` and the command exited non-zero (125: the node's bootstrap failed).
        """
        node_env, argv, cgroup = self._boot(command, env)
        try:
            proc = subprocess.Popen(argv, env=node_env, text=True, errors="replace",
                                    stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try:
                stdout, stderr = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
                timed_out = NodeTimeout(list(command), timeout, stdout, stderr)
                timed_out.usage = cgroup.finish() if cgroup else None
                raise timed_out from None
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        finally:
            usage = cgroup.finish() if cgroup else None  # the cgroup goes with the node, however it ended
        if usage is None:
            usage = NodeUsage(node=self.name, cgroup="", limits=self.limits, enforced=())
        if check and proc.returncode != 0:
            failed = NodeError(proc.returncode, list(command), stdout, stderr)
            failed.usage = usage
            raise failed
        return NodeResult(list(command), proc.returncode, stdout, stderr, usage)

    def __repr__(self) -> str:
        return f"Node({self.name!r})"


__all__ = ["UNSHARE", "Node", "NodeError", "NodeResult", "NodeTimeout", "bootstrap_script", "namespaces_unavailable",
           "stop_node"]
