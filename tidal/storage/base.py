"""Where step outputs live, and the atomic commit of a step directory.

Invariant (docs/architecture.md §1): a step is committed exactly when ``{root}/{step_id}/_SUCCESS``
exists, and ``_SUCCESS`` appears only after every other file is complete. Locally a
non-resumable step is written in a scratch directory under ``{root}/.scratch`` that holds
``_SUCCESS`` already and is then renamed into place: ``rename`` is atomic on one file
system, so a reader sees either nothing or the whole step. A crash at any point leaves
only scratch, which never counts as committed and is cleared on the next attempt.

On an object store (``s3://``, :mod:`tidal.storage.s3`) a step still computes in a local
scratch directory; its commit uploads every file, then ``manifest.json`` and ``step.json``,
then ``_SUCCESS`` last. Both backends implement :class:`Storage`, so step code, the runner
and the launchers do not know which one they use: readers get committed inputs as local
directories (:meth:`Storage.input_dir`), and a lease (:mod:`tidal.storage.lease`) keeps two workers
from computing the same step at once.

Shared state is objects under the root, never a local file (docs/architecture.md §0): the failure catalog,
failed-attempt evidence and buffered tracking calls go through :meth:`Storage.write_object`,
:meth:`Storage.read_object`, :meth:`Storage.list_rel` and :meth:`Storage.delete_rel`, names
relative to the root (``failures/<fp>/<file>.json``), so a pod that starts later, on another
node, sees what an earlier one wrote. A failed attempt is kept as ``.failed/{step_id}.{UTC
time}.{rand}/`` (newest ``failed_attempts_kept`` per step).

Scratch staleness decides by the step's lease and by age, never by a pid or hostname (two pods
on one cache volume have separate PID namespaces and may share a hostname). A scratch
directory ``.scratch/{step_id}.*`` is removed by :meth:`LocalStorage.new_scratch` (and the
object store's) when either

1. this process holds the step's lease (the runner makes scratch under it): by the lease
   invariant no other attempt holds it, so every other scratch of the step belongs to an
   attempt that ended, was killed, or lost its lease and can never commit; or
2. the step's lease is free (absent, released or expired) and nothing in the directory (nor
   in its ``.job`` sibling) was written for ``lease_ttl_s`` seconds (a Beam job's scratch,
   made by its prepare task without a lease, stays while its workers write).

While another worker holds the lease, nothing is removed (:func:`sweep_scratch`).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tidal.storage.layout import SUCCESS, atomic_write_bytes
from tidal.storage.lease import Lease, LeaseStore, LocalLeaseStore, held_here, is_free

SCRATCH = ".scratch"
FAILED = ".failed"


class StorageError(RuntimeError):
    """A storage root cannot be used (unsupported scheme, not writable)."""


class StorageUnreachable(StorageError):
    """The bucket's endpoint does not answer, or refuses these credentials (names the setting)."""


@dataclass(frozen=True)
class StorageSettings:
    """Where and how fast step outputs move; never part of a step's hash (recipe ``storage:``).

    Attributes:
        endpoint_url: S3 API endpoint (AWS S3 when None; ``https://storage.googleapis.com``
            for GCS's S3-interoperable XML API; a MinIO URL). ``TIDAL_S3_ENDPOINT_URL``
            overrides it; else boto3's own ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` apply.
        region: bucket region (None: boto3's chain, e.g. ``AWS_DEFAULT_REGION``).
        max_attempts: botocore attempts per request in ``adaptive`` retry mode (first try
            included; botocore's default is 3, raised because shared buckets answer 503 SlowDown
            under load and AWS asks clients to back off and retry: S3 User Guide, "Best practices
            design patterns: optimizing Amazon S3 performance").
        multipart_threshold_bytes: files at least this large upload in parts (bytes; boto3's
            default is 8 MiB: larger parts mean fewer requests for checkpoints).
        multipart_chunk_bytes: part size (bytes; S3 allows 5 MiB to 5 GiB and 10,000 parts,
            s3transfer enlarges parts for files past 10,000 x chunk).
        max_concurrency: parallel part transfers per file and parallel files per commit.
        page_size: keys per ListObjectsV2 page (1000 is the S3 maximum).
        connect_timeout_s, read_timeout_s: socket timeouts per request (seconds).
        lease_ttl_s: seconds a step lease lives without a heartbeat (heartbeats every ttl/4).
        lease_wait_s: longest wait (seconds) for another worker's lease before giving up.
        cache_dir: local directory for scratch and materialized inputs of object-store roots
            (default ``TIDAL_STORAGE_CACHE`` or ``~/.cache/tidal/storage``).
        failed_attempts_kept: failed attempts kept per step under ``{root}/.failed`` (newest
            first; older ones are deleted when a new one is kept; 0 keeps none). Bounds what
            a step that keeps failing costs in the bucket; 3 shows a pattern without hoarding.
    """

    endpoint_url: str | None = None
    region: str | None = None
    max_attempts: int = 10
    multipart_threshold_bytes: int = 64 * 2**20
    multipart_chunk_bytes: int = 16 * 2**20
    max_concurrency: int = 8
    page_size: int = 1000
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    lease_ttl_s: float = 120.0
    lease_wait_s: float = 1800.0
    cache_dir: str | None = None
    failed_attempts_kept: int = 3


class Storage(Protocol):
    """What the runner and launchers need from a storage root (local directory or object store).

    ``step_dir``, ``input_dir``, scratch and resumable directories are always local paths;
    ``step_uri`` says where the committed step really lives.
    """

    settings: StorageSettings

    @property
    def uri(self) -> str:
        """The root as a URI string (``/abs/path`` or ``s3://bucket/prefix``)."""

    @property
    def local_dir(self) -> Path:
        """A local directory of this root for files that must be local (embedded MLflow store)."""

    def step_uri(self, step_id: str) -> str:
        """Where a committed step's files live."""

    def step_dir(self, step_id: str) -> Path:
        """Local path of a step's committed files (for object stores: the materialized copy)."""

    def input_dir(self, step_id: str) -> Path:
        """A committed step's files as a local directory, verified (downloads if needed)."""

    def read_text(self, step_id: str, name: str) -> str:
        """One file of a committed step, e.g. ``step.json``, without materializing the rest."""

    def is_committed(self, step_id: str) -> bool:
        """True iff the step's ``_SUCCESS`` marker exists."""

    def new_scratch(self, step_id: str) -> Path:
        """A fresh local scratch directory for one attempt."""

    def resumable_dir(self, step_id: str) -> Path:
        """A local work directory kept across attempts (resumable kinds: training)."""

    def clear_uncommitted(self, step_id: str) -> None:
        """Remove leftovers of a crashed attempt (never a committed step)."""

    def commit_scratch(self, scratch: Path, step_id: str) -> bool:
        """Publish a scratch directory holding ``_SUCCESS``; False if committed by another first."""

    def commit_resumable(self, work_dir: Path, step_id: str) -> None:
        """Publish a resumable work directory after ``write_commit`` wrote its marker."""

    def keep_failed(self, scratch: Path, step_id: str) -> str:
        """Keep a failed attempt under ``{root}/.failed/`` for inspection (removes ``scratch``); returns its URI."""

    def failed_attempts(self, step_id: str) -> list[str]:
        """Kept failed attempts, oldest first, as names relative to the root ending in ``/``
        (``.failed/{step_id}.{time}.{rand}/``): read a file with ``read_object(attempt + name)``."""

    def clear_attempts(self, step_id: str) -> None:
        """Remove kept failed attempts after a commit."""

    def discard(self, step_id: str) -> Any:
        """Un-commit a step (forced rerun): the marker goes first."""

    def lease(self, step_id: str) -> Lease:
        """A (not yet acquired) lease on ``step_id``."""

    def write_object(self, rel: str, data: bytes) -> str:
        """Write one object ``{root}/{rel}`` atomically (a reader sees all of it or nothing); its URI."""

    def read_object(self, rel: str) -> bytes | None:
        """The bytes of ``{root}/{rel}``, or None if there is no such object."""

    def list_rel(self, prefix: str) -> list[str]:
        """Names relative to the root of every object whose name starts with ``prefix``, sorted."""

    def delete_rel(self, rels: Iterable[str]) -> None:
        """Delete these objects (names relative to the root); missing ones are no error."""

    def object_uri(self, rel: str) -> str:
        """Where ``{root}/{rel}`` lives (a local path, or ``s3://bucket/key``)."""


@dataclass(frozen=True)
class LocalStorage:
    """A storage root on the local file system."""

    root: Path
    settings: StorageSettings = field(default_factory=StorageSettings)

    @classmethod
    def from_uri(cls, uri: str, base: Path | None = None, settings: StorageSettings | None = None) -> LocalStorage:
        """Open a local storage root; relative paths resolve against ``base`` (default: cwd).

        Raises:
            StorageError: for URIs of other schemes (``s3://`` goes through :func:`open_storage`).
        """
        if "://" in uri and not uri.startswith("file://"):
            raise StorageError(
                f"storage root {uri!r}: scheme not supported; use a local directory, s3://bucket/prefix or "
                "gs://bucket/prefix (MinIO and other S3 servers: s3:// with TIDAL_S3_ENDPOINT_URL)"
            )
        if uri.startswith("file:") and not uri.startswith("file:///"):
            raise StorageError(f"storage root {uri!r}: a file URI names an absolute local path, file:///abs/path "
                               "(no host; a relative root is a plain path)")
        path = Path(uri.removeprefix("file://")).expanduser()
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        return cls(path.resolve(), settings or StorageSettings())

    @property
    def uri(self) -> str:
        """The root directory as a string."""
        return str(self.root)

    @property
    def local_dir(self) -> Path:
        """The root itself."""
        return self.root

    def step_uri(self, step_id: str) -> str:
        """The committed directory of a step, as a string."""
        return str(self.step_dir(step_id))

    def step_dir(self, step_id: str) -> Path:
        """The committed location of a step's outputs."""
        return self.root / step_id

    def input_dir(self, step_id: str) -> Path:
        """The committed directory itself (already local and complete)."""
        return self.step_dir(step_id)

    def read_text(self, step_id: str, name: str) -> str:
        """A file of a committed step. Raises FileNotFoundError naming the path."""
        return (self.step_dir(step_id) / name).read_text()

    def resumable_dir(self, step_id: str) -> Path:
        """The step directory itself, created if needed (kept across failed attempts)."""
        path = self.step_dir(step_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def commit_resumable(self, work_dir: Path, step_id: str) -> None:
        """Nothing to do: ``write_commit`` wrote ``_SUCCESS`` last, in place."""

    def lease(self, step_id: str) -> Lease:
        """A lease file ``{root}/.leases/{step_id}.json`` (see :mod:`tidal.storage.lease`)."""
        return Lease(LocalLeaseStore(self.root), step_id, ttl_s=self.settings.lease_ttl_s)

    def is_committed(self, step_id: str) -> bool:
        """True iff the step's ``_SUCCESS`` marker exists (a single ``stat``)."""
        return (self.root / step_id / SUCCESS).is_file()

    def new_scratch(self, step_id: str) -> Path:
        """A fresh, empty scratch directory for one attempt at ``step_id``.

        Stale scratch of earlier attempts of the step is removed first, by the lease-and-age
        rule of the module docstring (:func:`sweep_scratch`); a live attempt's scratch stays.
        """
        return make_scratch(self.root / SCRATCH, step_id, LocalLeaseStore(self.root), self.settings.lease_ttl_s)

    def clear_uncommitted(self, step_id: str) -> None:
        """Remove a leftover, uncommitted output directory of ``step_id`` (a crashed attempt)."""
        path = self.step_dir(step_id)
        if path.exists() and not self.is_committed(step_id):
            shutil.rmtree(path)

    def commit_scratch(self, scratch: Path, step_id: str) -> bool:
        """Atomically move a scratch directory (already holding ``_SUCCESS``) into place.

        Returns:
            True if this call committed; False if another attempt committed first (the
            scratch is then discarded: both computed the same content-addressed result).
        """
        target = self.step_dir(step_id)
        self.clear_uncommitted(step_id)
        try:
            os.rename(scratch, target)
        except OSError:
            if self.is_committed(step_id):
                shutil.rmtree(scratch, ignore_errors=True)
                return False
            raise
        return True

    def keep_failed(self, scratch: Path, step_id: str) -> str:
        """Move a failed attempt's scratch to ``{root}/.failed/{step_id}.{UTC time}.{rand}`` for inspection.

        It never counts as committed; it is removed when the step next commits. Only the newest
        ``settings.failed_attempts_kept`` attempts of the step stay. Returns the kept directory.
        """
        target = self.root / FAILED / attempt_name(step_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(scratch, target)
        for old in prune(self.failed_attempts(step_id), self.settings.failed_attempts_kept):
            shutil.rmtree(self.root / old, ignore_errors=True)
        return str(target)

    def failed_attempts(self, step_id: str) -> list[str]:
        """Kept failed attempts of ``step_id``, oldest first: ``[".failed/{step_id}.{time}.{rand}/"]``."""
        return sorted(f"{FAILED}/{p.name}/" for p in (self.root / FAILED).glob(f"{step_id}.*") if p.is_dir())

    def clear_attempts(self, step_id: str) -> None:
        """Remove kept failed attempts and forced-aside copies of a step that has committed."""
        paths = [self.root / a for a in self.failed_attempts(step_id)]
        for path in [*paths, *(self.root / SCRATCH).glob(f"{step_id}.discarded.*")]:
            shutil.rmtree(path, ignore_errors=True)

    def discard(self, step_id: str) -> Path | None:
        """Move a committed step aside (for a forced rerun); returns where it went."""
        path = self.step_dir(step_id)
        if not path.exists():
            return None
        trash = self.root / SCRATCH / f"{step_id}.discarded.{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, trash)
        return trash

    # -- objects under the root (shared state: failure catalog, failed attempts, pending tracking) --
    def write_object(self, rel: str, data: bytes) -> str:
        """Write ``{root}/{rel}`` atomically (temporary sibling, then rename); returns its path.

        Raises:
            ValueError: ``rel`` is empty, absolute or holds ``..`` (:func:`check_rel`).
        """
        path = self.root / check_rel(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        return str(path)

    def read_object(self, rel: str) -> bytes | None:
        """The bytes of ``{root}/{rel}``, or None if it does not exist (or is a directory)."""
        try:
            return (self.root / check_rel(rel)).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def list_rel(self, prefix: str) -> list[str]:
        """Every file under the root whose relative name starts with ``prefix``, recursive, sorted.

        Temporary files of a write in progress (``.{name}.{pid}.{rand}.tmp``) are not listed.
        """
        check_rel(prefix, prefix=True)
        base = self.root / prefix.rpartition("/")[0]
        if not base.is_dir():
            return []
        names = (p.relative_to(self.root).as_posix() for p in base.rglob("*")
                 if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".tmp")))
        return sorted(n for n in names if n.startswith(prefix))

    def delete_rel(self, rels: Iterable[str]) -> None:
        """Delete these files (missing ones are no error), then their parent directories that became empty."""
        for rel in rels:
            path = self.root / check_rel(rel)
            path.unlink(missing_ok=True)
            for parent in path.parents:
                if parent == self.root or self.root not in parent.parents:
                    break
                try:
                    parent.rmdir()
                except OSError:  # not empty (or gone): stop climbing
                    break

    def object_uri(self, rel: str) -> str:
        """The local path of ``{root}/{rel}``."""
        return str(self.root / check_rel(rel, prefix=True))


ATTEMPT_TIME = "%Y%m%dT%H%M%S%fZ"  # UTC to the microsecond: attempt names sort oldest first
JOB_SUFFIX = ".job"  # the sibling a Beam job's prepare writes next to its scratch (tidal/core/beam_job.py)


def check_rel(rel: str, *, prefix: bool = False) -> str:
    """``rel`` if it is a '/'-separated name relative to a storage root.

    Args:
        prefix: allow an empty name and a trailing '/' (a listing prefix, a directory's URI).

    Raises:
        ValueError: an absolute name, a ``..`` or ``.`` component, an empty component, a backslash,
            or (unless ``prefix``) an empty name; says which.
        TypeError: ``rel`` is not a str (a Path: pass ``path.as_posix()`` of a relative path).
    """
    if not isinstance(rel, str):
        raise TypeError(f"object name must be a str relative to the storage root, got {type(rel).__name__}")
    if rel.startswith("/") or "\\" in rel or "://" in rel:
        raise ValueError(f"object name {rel!r} must be relative to the storage root ('a/b.json'), not absolute")
    parts = rel.split("/")
    if prefix and parts and parts[-1] == "":
        parts = parts[:-1]
    if not parts and not prefix or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"object name {rel!r}: components may not be empty, '.' or '..'")
    return rel


def attempt_name(step_id: str) -> str:
    """``{step_id}.{UTC time}.{rand}``: a new failed attempt's directory name (sorts oldest first)."""
    from datetime import UTC, datetime

    return f"{step_id}.{datetime.now(UTC).strftime(ATTEMPT_TIME)}.{uuid.uuid4().hex[:6]}"


def prune(attempts: list[str], kept: int) -> list[str]:
    """The attempts (oldest first) beyond the newest ``kept``: those to delete."""
    return attempts[:-kept] if kept > 0 else list(attempts)


def _last_write(path: Path) -> float:
    """Newest mtime (unix seconds) of ``path`` and everything under it; 0 if it is gone."""
    newest = 0.0
    for item in [path, *(path.rglob("*") if path.is_dir() else ())]:
        try:
            newest = max(newest, item.lstat().st_mtime)
        except FileNotFoundError:
            continue
    return newest


def sweep_scratch(scratch_root: Path, step_id: str, leases: LeaseStore, expiry_s: float) -> list[Path]:
    """Remove the stale scratch directories of ``step_id`` under ``scratch_root`` (rule: module docstring).

    Args:
        leases: where the step's lease lives (the root's lease store: for an object store, the bucket).
        expiry_s: seconds without a write after which an attempt's scratch is stale while the
            lease is free (``storage.lease_ttl_s``: as long as a holder may go without a heartbeat).

    Returns:
        The directories removed. Forced-aside copies (``{step_id}.discarded.*``) are never touched.
    """
    candidates = [p for p in scratch_root.glob(f"{step_id}.*") if not p.name.startswith(f"{step_id}.discarded.")]
    if not candidates:
        return []
    current = leases.read(step_id)
    record = current[0] if current is not None else None
    mine = record is not None and held_here(record)
    if record is not None and not mine and not is_free(record):
        return []  # another worker holds the lease: any of these may be its live attempt
    attempts: dict[str, list[Path]] = {}
    for path in candidates:
        attempts.setdefault(path.name.removesuffix(JOB_SUFFIX), []).append(path)
    now, removed = time.time(), []
    for paths in attempts.values():
        if mine or now - max(_last_write(p) for p in paths) > expiry_s:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def make_scratch(scratch_root: Path, step_id: str, leases: LeaseStore, expiry_s: float) -> Path:
    """:func:`sweep_scratch`, then a new empty ``{scratch_root}/{step_id}.{pid}.{rand}`` (the pid only
    makes the name readable; nothing decides by it)."""
    sweep_scratch(scratch_root, step_id, leases, expiry_s)
    path = scratch_root / f"{step_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path
