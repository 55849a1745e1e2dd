"""Objects in a ``gs://`` bucket through GCS's JSON API (google-cloud-storage), for :mod:`tidal.storage.uris`.

Why a second client next to boto3: a sharded checkpoint's arrays go to GCS through TensorStore's own GCS
client (the JSON API, Application Default Credentials: Workload Identity on GKE), and the objects that
make it count (its manifest, the shard records, retention's deletes) must go to the same API with the same
credentials, or a deployment with Workload Identity and no HMAC key could write arrays it cannot commit.
The JSON API also has the preconditions the commit protocol relies on: "create only if absent" is
``ifGenerationMatch=0`` (cloud.google.com/storage/docs/request-preconditions), and copies are server-side
rewrites. The step store itself (:class:`tidal.storage.s3.S3Storage`) still reaches ``gs://`` through the
S3-interoperable XML API.

Endpoint: ``TIDAL_GCS_ENDPOINT_URL`` (an emulator such as fake-gcs-server; unset: Google's), which
:func:`tensorstore_env` hands TensorStore too. Credentials: Application Default Credentials when there are
any, else anonymous (TensorStore's rule, so both clients behave alike; an emulator needs none).

google-cloud-storage is imported inside the functions that use it: it takes 0.7 s to import (boto3 0.3 s), and
only a process that reaches a ``gs://`` bucket through this API should pay it.

Errors: ``FileNotFoundError`` for a missing object, :class:`StorageUnreachable` naming the setting to check for
an endpoint that does not answer or refuses the credentials.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from tidal.settings import current
from tidal.storage.base import StorageError, StorageSettings, StorageUnreachable

GOOGLE_ENDPOINT = "https://storage.googleapis.com"
# A request that keeps failing (5xx, 429, a refused connection) is retried with the library's backoff until
# this many seconds have passed, then fails with one error line: the bound the checkpoint arrays' TensorStore
# requests have (tidal.train.shard_arrays.REQUEST_RETRIES, about 16 s). Each try is bounded by the storage
# settings' connect and read timeouts (10 s, 120 s), so a stalled endpoint can take one read timeout more.
RETRY_DEADLINE_S = 16.0
TENSORSTORE_ENDPOINT_ENV = "TENSORSTORE_GCS_HTTP_URL"  # TensorStore reads its GCS endpoint only from here
T = TypeVar("T")


def endpoint() -> str:
    """The JSON API's base URL: ``TIDAL_GCS_ENDPOINT_URL`` or Google's."""
    return str(current().gcs_endpoint_url or GOOGLE_ENDPOINT).rstrip("/")


def tensorstore_env() -> None:
    """Point TensorStore's GCS client at :func:`endpoint` when it is not Google's (TensorStore has no spec field
    for it, only ``TENSORSTORE_GCS_HTTP_URL``, read once per process at its first GCS request)."""
    if current().gcs_endpoint_url:
        os.environ.setdefault(TENSORSTORE_ENDPOINT_ENV, endpoint())


_CLIENT_LOCK = threading.Lock()


@cache
def _client(url: str) -> Any:
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    try:
        credentials, project = google.auth.default()
    except DefaultCredentialsError as err:
        if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):  # named, but broken: say so, do not go anonymous
            raise StorageUnreachable(f"GOOGLE_APPLICATION_CREDENTIALS: {err}") from None
        credentials, project = AnonymousCredentials(), None
    made = storage.Client(project=project or "tidal", credentials=credentials, client_options={"api_endpoint": url})
    _ = made._http  # the authorized session, made now rather than lazily by the first of several threads
    return made


def client() -> Any:
    """The process's google-cloud-storage client for :func:`endpoint`: made once, under a lock (the save's
    threads start together, and each would otherwise look up credentials and build its own)."""
    with _CLIENT_LOCK:
        return _client(endpoint())


@cache
def retry() -> Any:
    """The library's default retry policy (transient errors only), bounded by :data:`RETRY_DEADLINE_S`."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(RETRY_DEADLINE_S)


def _call(uri: str, what: str, fn: Callable[[], T], *, missing: str = "object") -> T:
    """Run one request and turn what can go wrong into one line: "not found" becomes FileNotFoundError when
    ``missing`` is ``"object"`` (a read: the object may be absent) and :class:`StorageUnreachable` naming the
    bucket when it is ``"bucket"`` (a write or a listing: only the bucket can be missing); a refused,
    unreachable or failing endpoint :class:`StorageUnreachable` naming the setting to check; any other answer
    of the API :class:`StorageError` with its code and message."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import GoogleAuthError
    from requests.exceptions import ConnectionError as RequestsConnectionError
    from requests.exceptions import Timeout

    try:
        return fn()
    except gexc.NotFound:
        if missing == "bucket":
            raise StorageUnreachable(f"{uri}: {what}: the bucket does not exist (check TIDAL_STORAGE_ROOT)") from None
        raise FileNotFoundError(f"{uri} does not exist") from None
    except (gexc.Forbidden, gexc.Unauthorized, GoogleAuthError) as err:
        raise StorageUnreachable(f"{uri}: {what} refused ({err.__class__.__name__}); check the credentials "
                                 "(Workload Identity or GOOGLE_APPLICATION_CREDENTIALS)") from None
    except (RequestsConnectionError, Timeout) as err:
        raise StorageUnreachable(f"{uri}: {what}: {endpoint()} does not answer ({type(err).__name__}); check "
                                 "TIDAL_GCS_ENDPOINT_URL") from None
    except gexc.RetryError as err:
        cause = err.cause if err.cause is not None else err
        if isinstance(cause, (RequestsConnectionError, Timeout)):
            raise StorageUnreachable(f"{uri}: {what}: {endpoint()} does not answer ({type(cause).__name__}, "
                                     f"retried for {RETRY_DEADLINE_S:.0f} s); check TIDAL_GCS_ENDPOINT_URL") from None
        raise StorageUnreachable(f"{uri}: {what} kept failing for {RETRY_DEADLINE_S:.0f} s ({type(cause).__name__}: "
                                 f"{str(cause)[:200]})") from None
    except gexc.PreconditionFailed:
        raise  # a create-if-absent that found an object: write_bytes's answer, not an error
    except gexc.GoogleAPICallError as err:  # an answer no retry changes: say which, no traceback
        raise StorageError(f"{uri}: {what} failed ({err.code} {type(err).__name__}: {str(err.message)[:200]})") \
            from None


def _timeout(settings: StorageSettings) -> tuple[float, float]:
    return (settings.connect_timeout_s, settings.read_timeout_s)


def read_bytes(uri: str, bucket: str, key: str) -> bytes:
    """One whole object. Raises FileNotFoundError / :class:`StorageUnreachable`."""
    blob = client().bucket(bucket).blob(key)
    return _call(uri, "read", lambda: blob.download_as_bytes(timeout=_timeout(StorageSettings()),
                                                                  retry=retry()))


def write_bytes(uri: str, bucket: str, key: str, data: bytes, *, if_absent: bool) -> bool:
    """Write one object (a reader sees all of it or nothing); with ``if_absent``, only if there is none
    (``ifGenerationMatch=0``). Returns False when ``if_absent`` found one there first."""
    from google.api_core import exceptions as gexc

    blob = client().bucket(bucket).blob(key)
    try:
        # a whole-object overwrite with the same bytes is safe to repeat, so unconditional writes retry too
        _call(uri, "write", lambda: blob.upload_from_string(
            data, if_generation_match=0 if if_absent else None, retry=retry(),
            timeout=_timeout(StorageSettings())), missing="bucket")
    except gexc.PreconditionFailed:
        return False
    return True


def list_objects(uri: str, bucket: str, head: str) -> dict[str, tuple[int, float]]:
    """Every object under ``head`` (a key prefix ending in '/'): name after it -> (bytes, created, unix s)."""
    def listing() -> dict[str, tuple[int, float]]:
        # time_created: when these bytes were written (a metadata change moves ``updated``, as it does not
        # move S3's LastModified), which is what a reader compares with the commit's marker
        return {blob.name[len(head):]: (int(blob.size), blob.time_created.timestamp())
                for blob in client().list_blobs(bucket, prefix=head, timeout=_timeout(StorageSettings()),
                                                retry=retry())}
    return _call(uri, "list", listing, missing="bucket")


def upload_files(uri: str, bucket: str, files: dict[str, Path], settings: StorageSettings) -> None:
    """Upload local files to ``{key: path}`` in parallel (resumable uploads above the library's 8 MiB)."""
    def put(item: tuple[str, Path]) -> None:
        key, path = item
        blob = client().bucket(bucket).blob(key)
        _call(uri, "upload", lambda: blob.upload_from_filename(str(path), retry=retry(), timeout=_timeout(settings)),
              missing="bucket")

    with ThreadPoolExecutor(max_workers=settings.max_concurrency) as pool:
        list(pool.map(put, sorted(files.items())))


def copy_objects(uri: str, pairs: list[tuple[str, str, str, str]], settings: StorageSettings) -> None:
    """Server-side copies ``(source bucket, source key, bucket, key)``: rewrites, repeated until done (GCS
    may answer a large or cross-location rewrite in several calls), so no byte passes through here."""
    def copy(pair: tuple[str, str, str, str]) -> None:
        src_bucket, src_key, bucket, key = pair
        source = client().bucket(src_bucket).blob(src_key)
        target = client().bucket(bucket).blob(key)
        token: str | None = None
        while True:
            token, _, _ = _call(uri, "copy", lambda t=token: target.rewrite(source, token=t, retry=retry(),
                                                                             timeout=_timeout(settings)))
            if token is None:
                return

    with ThreadPoolExecutor(max_workers=settings.max_concurrency) as pool:
        list(pool.map(copy, pairs))


def delete_keys(uri: str, bucket: str, keys: list[str], settings: StorageSettings) -> None:
    """Delete objects in parallel (the JSON API deletes one object per request); a missing one is fine."""
    def delete(key: str) -> None:
        try:
            _call(uri, "delete", lambda: client().bucket(bucket).blob(key).delete(timeout=_timeout(settings),
                                                                                  retry=retry()))
        except FileNotFoundError:
            pass

    with ThreadPoolExecutor(max_workers=settings.max_concurrency) as pool:
        list(pool.map(delete, keys))
