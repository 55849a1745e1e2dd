"""Leases: two workers that start the same step at once never both compute and commit it.

Invariant: at most one live lease object ``{root}/.leases/{step_id}.json`` exists per step,
and it changes only by compare-and-swap: created only if absent (S3 ``PutObject`` with
``If-None-Match: *``; locally ``open(O_CREAT | O_EXCL)``), renewed, taken over or released
only if its version token is unchanged (S3 ``If-Match: <ETag>``; locally the sha256 of the
file's bytes, compared and replaced under an ``flock``). A holder renews (heartbeats) every
``ttl_s / 4`` seconds from a daemon thread; only a lease whose ``expires_at`` has passed or
that was released may be taken over. Nothing decides by a process id or a hostname: pods
that share a volume or a bucket have their own PID namespaces and may share a hostname, so
"that pid is not running here" says nothing about another pod's holder. A holder killed
without releasing blocks its step for at most ``ttl_s``. Before a holder publishes its output
it renews once more (:meth:`Lease.ensure_held`): a holder that lost its lease (paused past
expiry, or an object store whose conditional write raced) raises :class:`LeaseLost` instead
of committing.

Heartbeat period and expiry follow the ratio of Kubernetes leader election (client-go
``leaderelection``: lease 15 s, retry 2 s, i.e. several renewals per lease duration), so a
holder survives three missed renewals before anyone may take over. Expiry compares the
writer's and reader's wall clocks (UTC): keep hosts NTP-synchronized; a skew well below
``ttl_s`` is harmless.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, Self

from tidal.storage.layout import temporary_name

LEASES = ".leases"
log = logging.getLogger("tidal.lease")
_HELD: set[str] = set()  # owners of the leases this process holds right now


class LeaseLost(RuntimeError):
    """This worker's lease was taken over (or could not be renewed) before it committed."""


class LeaseTimeout(RuntimeError):
    """Waited ``wait_s`` seconds for another worker's lease on the step; it neither committed nor expired."""


class LeaseStore(Protocol):
    """Compare-and-swap storage of one small JSON object per step (see the module docstring)."""

    def create(self, step_id: str, body: bytes) -> str | None:
        """Write ``body`` only if no lease object exists; its version token, or None if one exists."""

    def read(self, step_id: str) -> tuple[dict[str, Any], str] | None:
        """The lease record and its version token, or None if there is none."""

    def replace(self, step_id: str, body: bytes, token: str) -> str | None:
        """Overwrite only if the version is still ``token``; the new token, or None if it changed."""

    def remove(self, step_id: str) -> None:
        """Delete the lease object (after it was released by compare-and-swap)."""


def _now() -> float:
    return time.time()


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def default_owner() -> str:
    """``host:pid:random`` naming this worker process (unique across hosts and restarts)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def is_free(record: dict[str, Any], now: float | None = None) -> bool:
    """True if a lease record may be taken over: it was released, or its ``expires_unix`` has passed.

    Args:
        now: unix seconds to compare with (default: the wall clock now).

    Every holder, on this host or another, is trusted until its expiry (module docstring).
    """
    now = _now() if now is None else now
    return bool(record.get("released")) or float(record.get("expires_unix", 0)) <= now


def held_here(record: dict[str, Any]) -> bool:
    """True if a :class:`Lease` object of this very process holds ``record`` right now (its owner is
    one this process acquired and has not released or lost): process memory, never a pid probe."""
    return str(record.get("owner", "")) in _HELD and not is_free(record)


class Lease:
    """A lease on one step, held by one worker.

    Args:
        store: where lease objects live (:class:`LocalLeaseStore` or the S3 one).
        step_id: the step it guards.
        ttl_s: seconds a lease stays valid without a heartbeat (seconds, > 0).
        owner: this worker's name (default :func:`default_owner`).
    """

    def __init__(self, store: LeaseStore, step_id: str, *, ttl_s: float = 120.0, owner: str | None = None):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
        self.store, self.step_id, self.ttl_s = store, step_id, float(ttl_s)
        self.owner = owner or default_owner()
        self.heartbeat_s = self.ttl_s / 4
        self._token: str | None = None
        self._record: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.lost = False

    @property
    def held(self) -> bool:
        """True while this worker holds the lease (acquired, not lost, not released)."""
        return self._token is not None and not self.lost

    def _body(self, acquired: float, took_over: str | None) -> dict[str, Any]:
        now = _now()
        return {"step_id": self.step_id, "owner": self.owner, "acquired_at": _iso(acquired),
                "acquired_unix": acquired, "heartbeat_at": _iso(now), "expires_at": _iso(now + self.ttl_s),
                "expires_unix": now + self.ttl_s, "ttl_s": self.ttl_s, "took_over_from": took_over,
                "released": False}

    def try_acquire(self) -> bool:
        """One attempt: create the lease, or take over a free one. True if this worker now holds it."""
        for _ in range(3):  # a lease removed between create and read: try again
            body = self._body(_now(), None)
            token = self.store.create(self.step_id, _encode(body))
            if token is not None:
                self._token, self._record = token, body
                _HELD.add(self.owner)
                return True
            current = self.store.read(self.step_id)
            if current is None:
                continue
            record, token = current
            if not is_free(record):
                return False
            body = self._body(_now(), None if record.get("released") else record.get("owner"))
            token = self.store.replace(self.step_id, _encode(body), token)
            if token is None:
                return False  # someone else took it over first
            if body["took_over_from"]:
                log.warning("lease on %s taken over from %s (expired at %s)", self.step_id,
                            record.get("owner"), record.get("expires_at"))
            self._token, self._record = token, body
            _HELD.add(self.owner)
            return True
        return False

    def acquire(self, *, wait_s: float, done: Callable[[], bool], poll_s: float = 1.0) -> bool:
        """Hold the lease, waiting up to ``wait_s`` seconds for another holder.

        Args:
            wait_s: longest wait for a live holder (seconds).
            done: polled while waiting; True (e.g. the winner committed) ends the wait.
            poll_s: seconds between attempts.

        Returns:
            True if this worker holds the lease (its heartbeat thread is running); False if
            ``done()`` became true first (nothing to do: skip).

        Raises:
            LeaseTimeout: neither happened within ``wait_s``; names the holder.
        """
        deadline = time.monotonic() + wait_s
        while True:
            if self.try_acquire():
                self._start_heartbeat()
                return True
            if done():
                return False
            if time.monotonic() >= deadline:
                current = self.store.read(self.step_id)
                holder = current[0] if current else {}
                raise LeaseTimeout(
                    f"step {self.step_id}: waited {wait_s:.0f} s for the lease held by {holder.get('owner')!r} "
                    f"(heartbeat {holder.get('heartbeat_at')}, expires {holder.get('expires_at')}); it neither "
                    "committed nor expired. Retry later, or raise storage.lease_wait_s in the recipe")
            time.sleep(poll_s)

    def renew(self) -> bool:
        """Extend the lease by ``ttl_s`` (compare-and-swap). False (and ``lost``) if it was taken over."""
        with self._lock:
            if self._token is None or self.lost:
                return False
            body = {**self._body(float(self._record["acquired_unix"]), self._record.get("took_over_from"))}
            try:
                token = self.store.replace(self.step_id, _encode(body), self._token)
            except Exception as err:  # noqa: BLE001 - a transient store error: the next heartbeat retries
                log.warning("lease heartbeat for %s failed: %s", self.step_id, err)
                return True
            if token is None:
                self.lost = True
                _HELD.discard(self.owner)
                return False
            self._token, self._record = token, body
            self.renewals += 1
            return True

    def ensure_held(self) -> None:
        """Renew once now; raises :class:`LeaseLost` if another worker holds the lease."""
        if not self.renew():
            raise LeaseLost(f"step {self.step_id}: lease of {self.owner} was lost (taken over by another "
                            "worker); not committing. The other worker commits the same content address")

    def release(self) -> None:
        """Stop the heartbeat, mark the lease released (compare-and-swap), then remove it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        with self._lock:
            _HELD.discard(self.owner)
            if self._token is None or self.lost:
                self._token = None
                return
            body = {**self._record, "released": True, "expires_unix": 0.0, "expires_at": _iso(_now())}
            try:
                if self.store.replace(self.step_id, _encode(body), self._token) is not None:
                    self.store.remove(self.step_id)
            except Exception as err:  # noqa: BLE001 - released or not, it expires after ttl_s
                if not self._remove_on_full_disk(err):
                    log.warning("releasing the lease on %s failed (it expires by itself): %s", self.step_id, err)
            self._token = None

    def _remove_on_full_disk(self, err: BaseException) -> bool:
        """On a full disk the released record cannot be written, but the file can still be deleted
        (an unlink needs no space): delete it if it is still this holder's (same token), so the rerun
        does not wait ``ttl_s`` for it to expire. True when removed."""
        from tidal.storage.disk import is_disk_full

        if not is_disk_full(err):
            return False
        try:
            current = self.store.read(self.step_id)
            if current is not None and current[1] == self._token:
                self.store.remove(self.step_id)
                return True
        except Exception:  # noqa: BLE001 - it expires by itself
            return False
        return False

    def record(self) -> dict[str, Any]:
        """What ``step.json`` keeps about the lease: owner, acquired/heartbeat/expiry times, ttl, renewals."""
        keys = ("owner", "acquired_at", "heartbeat_at", "expires_at", "ttl_s", "took_over_from")
        return {**{k: self._record.get(k) for k in keys}, "renewals": self.renewals}

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.heartbeat_s):
                if not self.renew():
                    log.error("lease on %s was taken over; this attempt will not commit", self.step_id)
                    return

        self._thread = threading.Thread(target=beat, name=f"lease-{self.step_id}", daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()


class LocalLeaseStore:
    """Lease objects as files ``{root}/.leases/{step_id}.json`` on one file system.

    Creation is ``O_CREAT | O_EXCL``; every operation holds ``fcntl.flock`` on a sibling
    ``.lock`` file so read-compare-replace is atomic between processes of one host (and on
    file systems with working ``flock``). The version token is the sha256 of the file's bytes.
    """

    def __init__(self, root: Path):
        self.dir = Path(root) / LEASES

    def _paths(self, step_id: str) -> tuple[Path, Path]:
        return self.dir / f"{step_id}.json", self.dir / f"{step_id}.lock"

    def _locked(self, step_id: str):
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def hold():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._paths(step_id)[1], os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing drops the flock

        return hold()

    def create(self, step_id: str, body: bytes) -> str | None:
        """``O_CREAT | O_EXCL``: the sha256 token, or None if the lease file exists."""
        path = self._paths(step_id)[0]
        with self._locked(step_id):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return None
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
            return hashlib.sha256(body).hexdigest()

    def read(self, step_id: str) -> tuple[dict[str, Any], str] | None:
        """The record and its sha256 token, or None."""
        path = self._paths(step_id)[0]
        with self._locked(step_id):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return None
        return json.loads(data), hashlib.sha256(data).hexdigest()

    def replace(self, step_id: str, body: bytes, token: str) -> str | None:
        """Write-to-temp and ``os.replace`` if the file's sha256 is still ``token``; else None."""
        path = self._paths(step_id)[0]
        with self._locked(step_id):
            try:
                if hashlib.sha256(path.read_bytes()).hexdigest() != token:
                    return None
            except FileNotFoundError:
                return None
            tmp = temporary_name(path)
            try:
                tmp.write_bytes(body)
                os.replace(tmp, path)
            except OSError:
                tmp.unlink(missing_ok=True)  # e.g. a full disk: no half-written temporary left behind
                raise
            return hashlib.sha256(body).hexdigest()

    def remove(self, step_id: str) -> None:
        """Delete the lease file (the ``.lock`` file stays)."""
        path = self._paths(step_id)[0]
        with self._locked(step_id):  # the .lock file stays: unlinking it would split the mutex
            path.unlink(missing_ok=True)
