"""Where step outputs live, and the atomic commit of a step directory.

Invariant (DESIGN.md §1): a step is committed exactly when ``{root}/{step_id}/_SUCCESS``
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
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tidal.layout import SUCCESS
from tidal.storage.lease import Lease, LocalLeaseStore
from tidal.storage.lease import pid_alive as _alive

SCRATCH = ".scratch"
FAILED = ".failed"


class StorageError(RuntimeError):
    """A storage root cannot be used (unsupported scheme, not writable)."""


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

    def keep_failed(self, scratch: Path, step_id: str) -> Path:
        """Keep a failed attempt for inspection; returns where."""

    def failed_attempts(self, step_id: str) -> list[Path]:
        """Kept failed attempts, oldest first."""

    def clear_attempts(self, step_id: str) -> None:
        """Remove kept failed attempts after a commit."""

    def discard(self, step_id: str) -> Any:
        """Un-commit a step (forced rerun): the marker goes first."""

    def lease(self, step_id: str) -> Lease:
        """A (not yet acquired) lease on ``step_id``."""


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
                f"storage root {uri!r}: scheme not supported; use a local directory or s3://bucket/prefix "
                "(GCS and MinIO through their S3 endpoints: set storage.endpoint_url in the recipe)"
            )
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

        Scratch left by earlier attempts of the same step whose process is gone (killed
        or crashed) is removed first; a live concurrent attempt's scratch is left alone.
        """
        for stale in (self.root / SCRATCH).glob(f"{step_id}.*.*"):
            pid = stale.name[len(step_id) + 1:].split(".")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        path = self.root / SCRATCH / f"{step_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

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

    def keep_failed(self, scratch: Path, step_id: str) -> Path:
        """Move a failed attempt's scratch to ``{root}/.failed/{step_id}.{n}`` for inspection.

        It never counts as committed; it is removed when the step next commits.
        """
        target = self.root / FAILED / f"{step_id}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(scratch, target)
        return target

    def failed_attempts(self, step_id: str) -> list[Path]:
        """Kept failed attempts of ``step_id``, oldest first."""
        return sorted((self.root / FAILED).glob(f"{step_id}.*"))

    def clear_attempts(self, step_id: str) -> None:
        """Remove kept failed attempts and forced-aside copies of a step that has committed."""
        for path in [*self.failed_attempts(step_id), *(self.root / SCRATCH).glob(f"{step_id}.discarded.*")]:
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
