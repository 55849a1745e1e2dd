"""Loopback ports for test servers that no other test process and no kernel-chosen port can take.

Why not ``bind(("127.0.0.1", 0))`` and close: the port goes back to the kernel's ephemeral pool
at once, and until the server binds it (an ``airflow db migrate`` can sit between the two for a
minute) another xdist worker's ``bind(0)`` may be handed the same port. Its server then answers
our health checks and ours fails to bind. Ports here come from below the ephemeral range
(``net.ipv4.ip_local_port_range``, which ``bind(0)`` and outgoing connections draw from), and
each is reserved for the life of the process that took it by a file created with ``O_EXCL``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path

from tests.reservations import reserve

RESERVATIONS = Path(os.environ.get("TMPDIR", "/tmp")) / "tidal-test-ports"
LOW, HIGH = 20000, 32000  # below Linux's default ephemeral range 32768-60999


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def _bindable(port: int) -> bool:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")):
        with socket.socket(family) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A TCP port on loopback that nothing listens on, reserved for this process until it exits.

    Drawn at random from [20000, min(32000, ephemeral low)); a port is taken only if its
    reservation file under ``$TMPDIR/tidal-test-ports`` could be created (or its owner has
    exited) and it binds on 127.0.0.1 and 0.0.0.0 right now. Raises RuntimeError after 500 draws.
    """
    high = min(HIGH, _ephemeral_low())
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(LOW, high)
        # a reserved port that does not bind is in use outside the tests: it stays reserved, undrawn
        if reserve(RESERVATIONS, str(port)) and _bindable(port):
            return port
    raise RuntimeError(f"no free loopback port in [{LOW}, {high}) after 500 draws (see {RESERVATIONS})")
