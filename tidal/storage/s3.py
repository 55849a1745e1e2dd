"""Step outputs in an S3-compatible bucket (AWS S3, GCS's XML API, MinIO) through boto3.

Invariant (docs/architecture.md §1, object stores): a step is committed exactly when the object
``{prefix}/{step_id}/_SUCCESS`` exists, and it is written last: the commit uploads every
data file, then ``manifest.json`` and ``step.json``, lists the prefix to check that every
manifest entry is there with its size, and only then puts ``_SUCCESS`` (whose body is the
manifest's root hash). A worker killed or a connection lost anywhere before that leaves a
prefix without ``_SUCCESS``, which never counts and is cleared by the next attempt.

Steps never see the bucket: they compute in a local scratch directory (under the cache
directory) and read their inputs from a local materialized copy, downloaded once per
committed step and verified file by file against its manifest (size and sha256) before it
is used (:meth:`S3Storage.input_dir`). The same step code therefore runs on both backends.

Requests use botocore's ``adaptive`` retry mode (exponential backoff with jitter plus a
client-side rate limiter that slows down on 503 SlowDown/throttling), multipart transfers
above ``multipart_threshold_bytes`` (s3transfer), and paginated ``ListObjectsV2``. Request
checksums are sent only where S3 requires them (``when_required``): the aws-chunked trailing
checksums boto3 sends by default since 1.36 are refused by GCS's S3-interoperable endpoint
and older MinIO releases, and every byte is verified against the manifest's sha256 anyway.

What pods share lives in the bucket, never in the cache (docs/architecture.md §0): failed attempts are
uploaded to ``{prefix}/.failed/`` by :meth:`S3Storage.keep_failed`, and the failure catalog and
buffered tracking calls are objects written through :meth:`S3Storage.write_object` (one
``PutObject`` each, listed with paginated ``ListObjectsV2``). The cache only holds this
process's scratch and materialized inputs, and may vanish with its pod.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidal.files.step_files import GCS_S3_ENDPOINT  # GCS's S3-interoperable XML API (HMAC keys)
from tidal.integrity.hashing import MANIFEST_NAME, verify_manifest
from tidal.settings import current as current_settings
from tidal.storage.base import (
    FAILED,
    SCRATCH,
    SUCCESS,
    LocalStorage,
    StorageError,
    StorageSettings,
    attempt_name,
    check_rel,
    make_scratch,
    prune,
)
from tidal.storage.layout import STEP_JSON
from tidal.storage.lease import LEASES, Lease
from tidal.storage.s3_leases import MISSING, S3LeaseStore, error_code

HOLD_BEFORE_MARKER_ENV = "TIDAL_STORAGE_HOLD_BEFORE_MARKER"  # tests only: see _test_hold()
log = logging.getLogger("tidal.storage_s3")


def s3_client(settings: StorageSettings) -> Any:
    """A boto3 S3 client configured from ``settings`` (endpoint, region, adaptive retries, timeouts)."""
    import boto3
    from botocore.config import Config

    endpoint = current_settings().s3_endpoint_url or settings.endpoint_url
    config = Config(
        region_name=settings.region,
        retries={"mode": "adaptive", "max_attempts": settings.max_attempts},
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        max_pool_connections=max(10, 4 * settings.max_concurrency),
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"} if endpoint else None,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)




def scheme_settings(scheme: str, settings: StorageSettings) -> StorageSettings:
    """``settings`` for a root of ``scheme``: a ``gs://`` root talks to GCS's S3-interoperable endpoint
    (:data:`GCS_S3_ENDPOINT`, region ``auto``) unless an endpoint is set (``TIDAL_S3_ENDPOINT_URL`` or
    ``storage.endpoint_url``); ``s3://`` is unchanged. Source: cloud.google.com/storage/docs/interoperability."""
    from dataclasses import replace

    if scheme == "gs" and not (current_settings().s3_endpoint_url or settings.endpoint_url):
        return replace(settings, endpoint_url=GCS_S3_ENDPOINT, region=settings.region or "auto")
    return settings


def transfer_config(settings: StorageSettings) -> Any:
    """The s3transfer settings: multipart above the threshold, in chunks, with parallel parts."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=settings.multipart_threshold_bytes,
                          multipart_chunksize=settings.multipart_chunk_bytes,
                          max_concurrency=settings.max_concurrency, use_threads=True)


@dataclass(frozen=True, eq=False)
class S3Storage:
    """A storage root ``s3://bucket/prefix``; local scratch and materialized inputs under ``cache``.

    Build it with :meth:`from_uri` (or :func:`tidal.storage.open_storage`).
    """

    bucket: str
    prefix: str
    settings: StorageSettings
    cache: Path
    scheme: str = "s3"

    @cached_property
    def client(self) -> Any:
        """The boto3 S3 client (made on first use: opening a root imports no boto3)."""
        return s3_client(self.settings)

    @classmethod
    def from_uri(cls, uri: str, settings: StorageSettings | None = None) -> S3Storage:
        """Open ``s3://bucket[/prefix]`` (or ``gs://``: GCS through its S3-interoperable endpoint,
        :func:`scheme_settings`); the bucket must exist (it is never created here).

        Raises:
            StorageError: the URI has no bucket.
        """
        parsed = urlparse(uri)
        if parsed.scheme not in ("s3", "gs") or not parsed.netloc:
            raise StorageError(f"storage root {uri!r}: expected s3://bucket/prefix or gs://bucket/prefix")
        settings = scheme_settings(parsed.scheme, settings or StorageSettings())
        prefix = parsed.path.strip("/")
        endpoint = current_settings().s3_endpoint_url or settings.endpoint_url or "default"
        base = Path(settings.cache_dir or current_settings().storage_cache or "~/.cache/tidal/storage")
        host = urlparse(endpoint).netloc.replace(":", "_") or endpoint
        cache = (base.expanduser() / host / parsed.netloc / prefix).resolve()
        return cls(parsed.netloc, prefix, settings, cache, parsed.scheme)

    # -- names ------------------------------------------------------------------------------
    @property
    def root(self) -> str:
        """The root URI (recorded in ``step.json`` as ``storage_root``)."""
        return self.uri

    @property
    def uri(self) -> str:
        """``s3://bucket/prefix`` (``gs://`` for a GCS root)."""
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def local_dir(self) -> Path:
        """The local cache directory of this root."""
        return self.cache

    def _key(self, step_id: str, rel: str = "") -> str:
        return "/".join(p for p in (self.prefix, step_id, rel) if p)

    def step_uri(self, step_id: str) -> str:
        """``s3://bucket/prefix/{step_id}/``."""
        return f"{self.scheme}://{self.bucket}/{self._key(step_id)}/"

    def step_dir(self, step_id: str) -> Path:
        """The local materialized copy's path (filled by :meth:`input_dir` or by this worker's commit)."""
        return self.cache / step_id

    @property
    def _local(self) -> LocalStorage:
        return LocalStorage(self.cache, self.settings)

    # -- listing and objects ----------------------------------------------------------------
    def list_objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (``{"Key", "Size", "ETag", ...}``), paginated ``page_size`` keys a page."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                   PaginationConfig={"PageSize": self.settings.page_size})
        for page in pages:
            yield from page.get("Contents", [])

    def _delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if response.get("Errors"):
                raise StorageError(f"{self.uri}: could not delete {response['Errors'][:3]}")

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as err:
            if error_code(err) in MISSING:
                return None
            raise

    def _get_text(self, key: str) -> str | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
        except Exception as err:
            if error_code(err) in MISSING:
                return None
            raise

    def is_committed(self, step_id: str) -> bool:
        """True iff ``{step}/_SUCCESS`` exists (one HEAD request)."""
        return self._head(self._key(step_id, SUCCESS)) is not None

    def read_text(self, step_id: str, name: str) -> str:
        """One file of a committed step (one GET). Raises FileNotFoundError naming the object."""
        text = self._get_text(self._key(step_id, name))
        if text is None:
            raise FileNotFoundError(f"{self.step_uri(step_id)}{name} does not exist")
        return text

    # -- reading committed steps ------------------------------------------------------------
    def input_dir(self, step_id: str) -> Path:
        """A committed step as a local directory, downloaded once and verified against its manifest.

        A cached copy is reused when its ``_SUCCESS`` (the manifest root hash) equals the
        bucket's; otherwise every manifest entry is downloaded into a temporary directory,
        checked (size, sha256, root hash) and renamed into place; other objects of the step
        (``step.json``, signatures) are downloaded with them.

        Raises:
            StorageError: the step is not committed, or a downloaded file does not match the
                manifest (names each file and what differs).
        """
        marker = self._get_text(self._key(step_id, SUCCESS))
        if marker is None:
            raise StorageError(f"{self.step_uri(step_id)} is not committed (no {SUCCESS})")
        target = self.step_dir(step_id)
        local_marker = target / SUCCESS
        if local_marker.is_file() and local_marker.read_text().strip() == marker.strip():
            return target
        tmp = self.cache / ".download" / f"{step_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            manifest_text = self.read_text(step_id, MANIFEST_NAME)
            manifest = json.loads(manifest_text)
            if manifest.get("root_hash") != marker.strip():
                raise StorageError(f"{self.step_uri(step_id)}: {SUCCESS} names root hash {marker.strip()[:12]} "
                                   f"but manifest.json has {str(manifest.get('root_hash'))[:12]}")
            head = self._key(step_id) + "/"
            rels = sorted({obj["Key"][len(head):] for obj in self.list_objects(head)} - {SUCCESS, MANIFEST_NAME})
            self._download_all(rels, step_id, tmp)  # data, step.json and any other commit record
            problems = verify_manifest(tmp, manifest)
            if problems:
                raise StorageError(f"{self.step_uri(step_id)}: downloaded files differ from manifest.json: "
                                   + "; ".join(problems[:10]))
            (tmp / MANIFEST_NAME).write_text(manifest_text)
            (tmp / SUCCESS).write_text(marker)  # last: a local copy without it is incomplete
            if target.exists():
                shutil.rmtree(target)
            try:
                os.rename(tmp, target)
            except OSError:  # another process materialized it at the same moment
                if not (local_marker.is_file() and local_marker.read_text().strip() == marker.strip()):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("materialized %s into %s", self.step_uri(step_id), target)
        return target

    def _download_all(self, rels: list[str], step_id: str, dest: Path) -> None:
        config = transfer_config(self.settings)

        def fetch(rel: str) -> None:
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, self._key(step_id, rel), str(path), Config=config)

        with ThreadPoolExecutor(max_workers=self.settings.max_concurrency) as pool:
            list(pool.map(fetch, rels))

    # -- writing ----------------------------------------------------------------------------
    def new_scratch(self, step_id: str) -> Path:
        """A fresh local scratch directory under the cache; stale ones are removed first by the
        lease-and-age rule of :mod:`tidal.storage.base` (the lease read is the bucket's)."""
        return make_scratch(self.cache / SCRATCH, step_id, self._lease_store(), self.settings.lease_ttl_s)

    def resumable_dir(self, step_id: str) -> Path:
        """A local work directory ``{cache}/.resume/{step_id}`` kept across attempts on this machine."""
        path = self.cache / ".resume" / step_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def clear_uncommitted(self, step_id: str) -> None:
        """Delete a half-written prefix (no ``_SUCCESS``) and any stale local copy of it."""
        if self.is_committed(step_id):
            return
        keys = [obj["Key"] for obj in self.list_objects(self._key(step_id) + "/")]
        if keys:
            log.warning("clearing %d objects of an uncommitted attempt at %s", len(keys), self.step_uri(step_id))
            self._delete_keys(keys)
        shutil.rmtree(self.step_dir(step_id), ignore_errors=True)

    def commit_scratch(self, scratch: Path, step_id: str) -> bool:
        """Upload a scratch directory (holding manifest.json, step.json, _SUCCESS), marker last.

        Returns:
            True if this call committed; False if the step was already committed (the scratch
            is discarded: same content address).

        Raises:
            StorageError: an uploaded file is missing or has the wrong size before the marker.
            botocore.exceptions.ClientError / BotoCoreError: a request failed after all retries
                (nothing is committed then).
        """
        if self.is_committed(step_id):
            shutil.rmtree(scratch, ignore_errors=True)
            return False
        self.clear_uncommitted(step_id)
        self._upload(scratch, step_id)
        self._keep_local(scratch, step_id)
        return True

    def commit_resumable(self, work_dir: Path, step_id: str) -> None:
        """Upload a finished resumable work directory, marker last, then keep it as the local copy."""
        self.commit_scratch(work_dir, step_id)

    def _keep_local(self, work_dir: Path, step_id: str) -> None:
        target = self.step_dir(step_id)
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(work_dir, target)

    def _upload(self, work_dir: Path, step_id: str) -> None:
        marker = (work_dir / SUCCESS).read_text()
        manifest = json.loads((work_dir / MANIFEST_NAME).read_text())
        config = transfer_config(self.settings)
        rels = sorted(p.relative_to(work_dir).as_posix() for p in work_dir.rglob("*") if p.is_file())
        data = [r for r in rels if r not in (SUCCESS, MANIFEST_NAME, STEP_JSON)]

        def put(rel: str) -> None:
            self.client.upload_file(str(work_dir / rel), self.bucket, self._key(step_id, rel), Config=config)

        with ThreadPoolExecutor(max_workers=self.settings.max_concurrency) as pool:
            list(pool.map(put, data))
        put(MANIFEST_NAME)
        put(STEP_JSON)
        sizes = {obj["Key"]: obj["Size"] for obj in self.list_objects(self._key(step_id) + "/")}
        wrong = [e["path"] for e in manifest["files"] if sizes.get(self._key(step_id, e["path"])) != e["bytes"]]
        wrong += [n for n in (MANIFEST_NAME, STEP_JSON) if self._key(step_id, n) not in sizes]
        if wrong:
            raise StorageError(f"{self.step_uri(step_id)}: before {SUCCESS}, these objects are missing or "
                               f"have the wrong size: {wrong[:10]}; nothing was committed")
        _test_hold()
        self.client.put_object(Bucket=self.bucket, Key=self._key(step_id, SUCCESS), Body=marker.encode())
        log.info("committed %s (%d files)", self.step_uri(step_id), len(rels))

    def keep_failed(self, scratch: Path, step_id: str) -> str:
        """Upload a failed attempt's scratch files to ``{root}/.failed/{step_id}.{UTC time}.{rand}/``,
        then remove the local scratch; only the newest ``settings.failed_attempts_kept`` attempts of
        the step stay in the bucket. Returns the attempt's URI (a gate's ``data_docs/`` included).

        Never raises for the bucket (the caller is already handling the step's own error): when an
        upload fails after all retries, the attempt is kept in this machine's cache instead
        (``{cache}/.failed/``, logged) and that path is returned.
        """
        attempt = f"{FAILED}/{attempt_name(step_id)}/"
        if self.settings.failed_attempts_kept > 0:
            config = transfer_config(self.settings)
            rels = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())

            def put(rel: str) -> None:
                self.client.upload_file(str(scratch / rel), self.bucket, self._rel_key(attempt + rel), Config=config)

            try:
                with ThreadPoolExecutor(max_workers=self.settings.max_concurrency) as pool:
                    list(pool.map(put, rels))
                for old in prune(self.failed_attempts(step_id), self.settings.failed_attempts_kept):
                    self.delete_rel(self.list_rel(old))
            except Exception as err:  # noqa: BLE001 - evidence is best effort; the step's error is what matters
                kept = self._local.keep_failed(scratch, step_id)
                log.warning("failed attempt of %s not uploaded to %s (%s); kept on this machine only at %s",
                            step_id, self.object_uri(attempt), err, kept)
                return kept
        shutil.rmtree(scratch, ignore_errors=True)
        return self.object_uri(attempt)

    def failed_attempts(self, step_id: str) -> list[str]:
        """Failed attempts kept in the bucket, oldest first: ``[".failed/{step_id}.{time}.{rand}/"]``
        (one paginated listing; an attempt whose scratch held no file left no object)."""
        return sorted({"/".join(rel.split("/")[:2]) + "/" for rel in self.list_rel(f"{FAILED}/{step_id}.")})

    def clear_attempts(self, step_id: str) -> None:
        """Delete a committed step's kept failed attempts in the bucket, and local leftovers in the cache."""
        self.delete_rel(self.list_rel(f"{FAILED}/{step_id}."))
        self._local.clear_attempts(step_id)

    def discard(self, step_id: str) -> str | None:
        """Un-commit a step for a forced rerun: delete ``_SUCCESS`` first, then its other objects."""
        keys = [obj["Key"] for obj in self.list_objects(self._key(step_id) + "/")]
        if not keys:
            return None
        marker = self._key(step_id, SUCCESS)
        if marker in keys:
            self.client.delete_object(Bucket=self.bucket, Key=marker)
        self._delete_keys([k for k in keys if k != marker])
        shutil.rmtree(self.step_dir(step_id), ignore_errors=True)
        return self.step_uri(step_id)

    def lease(self, step_id: str) -> Lease:
        """A lease object ``{prefix}/.leases/{step_id}.json`` written with conditional PUTs."""
        return Lease(self._lease_store(),
                     step_id, ttl_s=self.settings.lease_ttl_s)

    # -- objects under the root (shared state: failure catalog, failed attempts, pending tracking) --
    def _lease_store(self) -> S3LeaseStore:
        return S3LeaseStore(self.client, self.bucket, "/".join(p for p in (self.prefix, LEASES) if p))

    def _rel_key(self, rel: str, *, prefix: bool = False) -> str:
        return "/".join(p for p in (self.prefix, check_rel(rel, prefix=prefix)) if p)

    def write_object(self, rel: str, data: bytes) -> str:
        """One ``PutObject`` of ``{prefix}/{rel}`` (atomic: S3 never shows part of an object); its URI.

        Raises:
            ValueError: ``rel`` is empty, absolute or holds ``..``.
            botocore.exceptions.ClientError / BotoCoreError: the request failed after all retries.
        """
        self.client.put_object(Bucket=self.bucket, Key=self._rel_key(rel), Body=data)
        return self.object_uri(rel)

    def read_object(self, rel: str) -> bytes | None:
        """One ``GetObject`` of ``{prefix}/{rel}``; None if there is no such key."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._rel_key(rel))["Body"].read()
        except Exception as err:
            if error_code(err) in MISSING:
                return None
            raise

    def list_rel(self, prefix: str) -> list[str]:
        """Names relative to the root of every key starting with ``{prefix}/{prefix}``, sorted
        (paginated ``ListObjectsV2``, ``page_size`` keys a page)."""
        head = f"{self.prefix}/" if self.prefix else ""
        return sorted(obj["Key"][len(head):] for obj in self.list_objects(head + check_rel(prefix, prefix=True)))

    def delete_rel(self, rels: Iterable[str]) -> None:
        """``DeleteObjects`` in batches of 1000; missing keys are no error.

        Raises:
            StorageError: the store refused some deletions (names the first ones).
        """
        self._delete_keys([self._rel_key(rel) for rel in rels])

    def object_uri(self, rel: str) -> str:
        """``s3://bucket/prefix/{rel}`` (``gs://`` for a GCS root)."""
        return f"{self.uri.split('://', 1)[0]}://{self.bucket}/{self._rel_key(rel, prefix=True)}"


def _test_hold() -> None:
    """Tests only: with ``TIDAL_STORAGE_HOLD_BEFORE_MARKER=FILE`` set, create FILE once the data,
    manifest and step.json are uploaded and wait (up to 120 s) before the marker, so a test can
    SIGKILL the worker exactly between data and marker."""
    flag = current_settings().hold_before_marker
    if flag:
        Path(flag).write_text(str(os.getpid()))
        time.sleep(120)
