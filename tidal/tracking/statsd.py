"""tidal's StatsD metrics: one UDP datagram per sample, never blocking or failing a step.

Invariant: a metric is fire-and-forget. Sending is one non-blocking ``sendto`` on a UDP
socket; any error (no route, unresolvable host, full buffer) is swallowed, so metrics can
never slow down or fail a step. The ``statsd`` package Airflow uses is not installed in
this environment, and the protocol is one line, so tidal writes the line itself.

Wire format (StatsD, github.com/statsd/statsd docs/metric_types.md; tags in the DogStatsD
extension ``|#k:v,...`` that the Prometheus statsd_exporter maps to labels)::

    tidal.step.run:1|c|#recipe:tiny,step:train,kind:train
    tidal.step.duration:1234.5|ms|#recipe:tiny,step:train,kind:train
    tidal.train.tokens_per_second:51234.2|g|#recipe:tiny

Configuration (environment): ``TIDAL_STATSD_HOST`` (unset: metrics off), ``TIDAL_STATSD_PORT``
(default 8125), ``TIDAL_STATSD_PREFIX`` (default ``tidal``). The names below are what the
Grafana dashboard (helm/tidal/dashboards/tidal.json) queries, after the statsd_exporter
turns dots into underscores (``tidal_step_run``); timers arrive there in seconds.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from tidal.settings import current

STEP_RUN = "step.run"                       # counter: steps computed
STEP_SKIPPED = "step.skipped"               # counter: steps skipped (already committed)
STEP_FAILED = "step.failed"                 # counter: failed step attempts
STEP_DURATION = "step.duration"             # timer (ms): wall time of the step itself
GATE_FAILED = "gate.failed"                 # counter: gate failures
TOKENS_PER_SECOND = "train.tokens_per_second"  # gauge: training throughput (tokens/s)
GOODPUT = "train.goodput"                   # gauge: productive step seconds / wall seconds of the trainer
CHECKPOINT_AGE = "checkpoint.age_seconds"   # gauge: age of the latest checkpoint (s) when reported
CHECKPOINT_TIME = "checkpoint.timestamp"    # gauge: unix time (s) of the latest checkpoint
BASELINE_DIFFERENCES = "baseline.differences"  # gauge: metrics outside tolerance in the last validation


class StatsdClient:
    """Send StatsD samples over UDP to ``host:port`` with names ``{prefix}.{name}``.

    Args:
        host: StatsD server (or statsd_exporter); None disables sending (every call is a no-op).
        port: UDP port (StatsD default 8125).
        prefix: name prefix without trailing dot.
    """

    def __init__(self, host: str | None, port: int = 8125, prefix: str = "tidal"):
        self.prefix = prefix.rstrip(".")
        self.address: tuple[str, int] | None = None
        self.sock: socket.socket | None = None
        if host:
            try:
                self.address = (socket.gethostbyname(host), int(port))
                self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            except OSError:
                self.address = self.sock = None

    @classmethod
    def from_env(cls) -> StatsdClient:
        """A client configured from ``TIDAL_STATSD_HOST`` / ``_PORT`` / ``_PREFIX``."""
        settings = current()
        return cls(settings.statsd_host, settings.statsd_port, settings.statsd_prefix)

    @property
    def enabled(self) -> bool:
        """Whether samples are sent anywhere."""
        return self.sock is not None

    def line(self, name: str, value: float, kind: str, tags: Mapping[str, str] | None = None) -> str:
        """The wire line of one sample (``kind``: ``c`` counter, ``g`` gauge, ``ms`` timer)."""
        text = f"{self.prefix}.{name}:{value:g}|{kind}"
        if tags:
            text += "|#" + ",".join(f"{_clean(k)}:{_clean(str(v))}" for k, v in sorted(tags.items()))
        return text

    def _send(self, name: str, value: float, kind: str, tags: Mapping[str, str] | None) -> None:
        if self.sock is None or self.address is None:
            return
        try:
            self.sock.sendto(self.line(name, value, kind, tags).encode(), self.address)
        except OSError:
            pass  # fire-and-forget: metrics never fail a step

    def incr(self, name: str, count: float = 1, tags: Mapping[str, str] | None = None) -> None:
        """Add ``count`` to a counter."""
        self._send(name, count, "c", tags)

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        """Set a gauge to ``value``."""
        self._send(name, value, "g", tags)

    def timing(self, name: str, seconds: float, tags: Mapping[str, str] | None = None) -> None:
        """Record a duration given in seconds (sent as milliseconds, the StatsD unit)."""
        self._send(name, seconds * 1000.0, "ms", tags)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _clean(text: str) -> str:
    """A tag key or value without the characters the line format reserves (``|,#:``)."""
    return "".join("_" if ch in "|,#:\n " else ch for ch in text)
