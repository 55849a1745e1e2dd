"""The test cluster's network: a network namespace per node, joined to a bridge, as pods on a node pool.

Each cluster reserves a /16, ``10.<octet>.0.0/16`` (octet 64..191, reserved per process by a file under
``$TMPDIR/tidal-test-nets``, as tests/ports.py reserves ports). The bridge ``tidalbr<octet>`` in the root
namespace holds the gateway ``10.<octet>.255.254``, where the shared services listen (the bucket, MLflow,
and relays to PostgreSQL and Redis, which listen on 127.0.0.1 only). Node ``k`` (1-based) is the network
namespace ``tidal<octet>-<k>`` with ``lo`` and ``eth0`` at :func:`node_address`; a veth pair joins its
``eth0`` to the bridge. A node has no route but its /16: nothing outside the cluster is reachable from it.

What this buys: ``localhost`` on a node is that node alone. A server on node B, however it binds, is not
reachable as ``127.0.0.1`` from node A, only at node B's address or name, as between two pods.

Requires root and iproute2's ``ip`` (``network_unavailable`` says why not).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.cluster.addresses import node_address
from tests.reservations import reserve

RESERVATIONS = Path(os.environ.get("TMPDIR", "/tmp")) / "tidal-test-nets"
OCTETS = range(64, 192)
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """An ``ip`` command that builds the cluster's network failed; the message has its output."""


def network_unavailable() -> str | None:
    """Why this machine cannot build the cluster's network, or None when it can."""
    if os.geteuid() != 0:
        return "the test cluster's network needs root (network namespaces, a bridge, veth pairs)"
    if shutil.which("ip") is None:
        return "the test cluster's network needs iproute2's `ip`, which is not on PATH"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")


def _remove_links(octet: int) -> None:
    """Delete the bridge and every node namespace of ``octet`` (a cluster's, stopped or crashed)."""
    for netns in sorted(NETNS_DIR.glob(f"tidal{octet}-*")) if NETNS_DIR.is_dir() else ():
        with contextlib.suppress(NetworkError):
            _ip("netns", "del", netns.name)
    if Path(f"/sys/class/net/tidalbr{octet}").exists():
        with contextlib.suppress(NetworkError):
            _ip("link", "del", f"tidalbr{octet}")


def _reserve() -> int:
    """An octet no live process holds; a stale holder's bridge and namespaces are removed first."""
    for octet in OCTETS:
        if reserve(RESERVATIONS, str(octet), on_stale=lambda octet=octet: _remove_links(octet)):
            if Path(f"/sys/class/net/tidalbr{octet}").exists():  # left by a process that never reserved
                _remove_links(octet)
            return octet
    raise NetworkError(f"every test network 10.{OCTETS[0]}..{OCTETS[-1]}.0.0/16 is held (see {RESERVATIONS})")


class ClusterNetwork:
    """One cluster's bridge and node namespaces. Build with :meth:`create`; :meth:`remove` at the end.

    Attributes:
        octet: the second octet of the cluster's /16.
        gateway: the bridge's address in the root namespace, where the shared services listen.
        bridge: the bridge's interface name.
    """

    def __init__(self, octet: int):
        self.octet = octet
        self.gateway = f"10.{octet}.255.254"
        self.bridge = f"tidalbr{octet}"
        self._nodes: dict[str, tuple[str, str]] = {}  # node name -> (netns name, address)

    @classmethod
    def create(cls) -> ClusterNetwork:
        """Reserve a /16 and bring its bridge up with the gateway address.

        Raises:
            NetworkError: every /16 is held, or an ``ip`` command failed.
        """
        net = cls(_reserve())
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/16", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
        except BaseException:
            net.remove()
            raise
        return net

    def add_node(self, name: str, index: int) -> str:
        """Create node ``name``'s namespace (the ``index``-th node, 1-based) joined to the bridge; its address.

        Raises:
            NetworkError: an ``ip`` command failed.
        """
        if name in self._nodes:
            return self._nodes[name][1]
        netns, address = f"tidal{self.octet}-{index}", node_address(index, self.octet)
        host_end = f"tv{self.octet}x{index}"  # interface names are at most 15 bytes
        _ip("netns", "add", netns)
        self._nodes[name] = (netns, address)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", host_end, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/16", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return address

    def netns_path(self, name: str) -> Path:
        """The file that names node ``name``'s network namespace (``nsenter --net=`` joins it)."""
        return NETNS_DIR / self._nodes[name][0]

    def remove(self) -> None:
        """Delete the namespaces and the bridge (the veth pairs go with them); release the /16."""
        _remove_links(self.octet)
        self._nodes.clear()
        with contextlib.suppress(FileNotFoundError):
            (RESERVATIONS / str(self.octet)).unlink()
