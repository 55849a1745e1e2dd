"""Small objects and whole directories named by a location: a bucket URI or a local path.

What one task hands another (a job's config, a training spec, a staged output, a summary) is
named by a location under the storage root (docs/architecture.md §0), never by a path on the writer's
disk. A location is ``s3://bucket/key`` (boto3), ``gs://bucket/key`` (GCS's JSON API,
:mod:`tidal.storage.gcs`, the API the checkpoint arrays use; through boto3 instead when
``TIDAL_S3_ENDPOINT_URL`` names an S3 server standing in for the bucket) or a local path (a local
root: one machine, or a volume every machine mounts). These functions are the only readers and
writers of such handed-over files, so a worker needs nothing but the location and the deployment's storage settings
(endpoint, region, credentials from the environment or Workload Identity).

Errors name the location and the setting to check: :class:`StorageUnreachable` for an endpoint
that does not answer or refuses the credentials, ``FileNotFoundError`` for a missing object.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidal.context import is_uri
from tidal.settings import current
from tidal.storage import gcs
from tidal.storage.base import StorageError, StorageSettings, StorageUnreachable
from tidal.storage.layout import atomic_write_bytes
from tidal.storage.s3 import s3_client, scheme_settings, transfer_config

log = logging.getLogger("tidal.storage")
SCHEMES = ("s3", "gs")


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``.

    Raises:
        StorageError: not an ``s3://`` / ``gs://`` URI, or no bucket.
    """
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES or not parsed.netloc:
        raise StorageError(f"{uri!r} is not a bucket URI (s3://bucket/key or gs://bucket/key)")
    return parsed.netloc, parsed.path.lstrip("/")


def join(location: str, *names: str) -> str:
    """``location`` + ``/name`` for a URI or a path (a trailing slash is kept off)."""
    return "/".join([location.rstrip("/"), *(n.strip("/") for n in names if n)])


def on_gcs(location: str) -> bool:
    """True for a ``gs://`` location reached through GCS's JSON API (:mod:`tidal.storage.gcs`): every
    ``gs://`` one unless ``TIDAL_S3_ENDPOINT_URL`` is set, which puts an S3 server in the bucket's place."""
    return location.startswith("gs://") and not current().s3_endpoint_url


@cache
def _client(scheme: str, endpoint: str | None) -> Any:
    return s3_client(scheme_settings(scheme, StorageSettings()))


def client_for(uri: str) -> Any:
    """The process's boto3 client for ``uri``'s scheme and the current ``TIDAL_S3_ENDPOINT_URL``."""
    return _client(urlparse(uri).scheme, current().s3_endpoint_url)


def _call(uri: str, what: str, fn, *args: Any, **kwargs: Any) -> Any:
    """Run a boto3 call; turn "no such key" into FileNotFoundError and connection / credential
    failures into :class:`StorageUnreachable` naming the setting."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    try:
        return fn(*args, **kwargs)
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NotFound"):
            raise FileNotFoundError(f"{uri} does not exist") from None
        if code in ("NoSuchBucket",):
            raise StorageUnreachable(f"{uri}: bucket does not exist (check TIDAL_STORAGE_ROOT)") from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise StorageUnreachable(f"{uri}: {what} refused ({code}); check the credentials "
                                     "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or Workload Identity)") from None
        raise
    except NoCredentialsError:
        raise StorageUnreachable(f"{uri}: no credentials for the bucket; set AWS_ACCESS_KEY_ID and "
                                 "AWS_SECRET_ACCESS_KEY (a Secret), or use Workload Identity") from None
    except EndpointConnectionError as err:
        raise StorageUnreachable(f"{uri}: the endpoint does not answer ({err}); check TIDAL_S3_ENDPOINT_URL") from None


def storage_hint(err: Exception) -> str:
    """Which setting to check for a failed bucket request (botocore's exception ``err``)."""
    name = type(err).__name__
    code = str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
    if name in ("NoCredentialsError", "PartialCredentialsError") or code in (
            "403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return ("check the bucket credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (a Secret; GCS: an HMAC "
                "key) or Workload Identity")
    if code == "NoSuchBucket":
        return "the bucket does not exist: check TIDAL_STORAGE_ROOT (or the recipe's storage_root)"
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError"):
        return "the bucket endpoint does not answer: check TIDAL_S3_ENDPOINT_URL (or storage.endpoint_url)"
    return "check TIDAL_STORAGE_ROOT, TIDAL_S3_ENDPOINT_URL and the bucket credentials"


def read_bytes(location: str) -> bytes:
    """One whole object or file.

    Raises:
        FileNotFoundError: naming the location; StorageUnreachable: as :func:`_call`.
    """
    if not is_uri(location):
        path = Path(location.removeprefix("file://"))
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        return path.read_bytes()
    bucket, key = split(location)
    if on_gcs(location):
        return gcs.read_bytes(location, bucket, key)
    client = client_for(location)
    return _call(location, "read", lambda: client.get_object(Bucket=bucket, Key=key)["Body"].read())


def write_bytes(location: str, data: bytes, *, if_absent: bool = False) -> bool:
    """Write one object or file (atomically: a reader sees all of it or nothing).

    Args:
        if_absent: write only if nothing is there (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``;
            locally ``O_EXCL``).

    Returns:
        True if written; False if ``if_absent`` and something was there first.
    """
    if not is_uri(location):
        path = Path(location.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if if_absent and path.exists():
            return False
        atomic_write_bytes(path, data)
        return True
    from botocore.exceptions import ClientError

    bucket, key = split(location)
    if on_gcs(location):
        return gcs.write_bytes(location, bucket, key, data, if_absent=if_absent)
    client = client_for(location)
    extra = {"IfNoneMatch": "*"} if if_absent else {}
    try:
        _call(location, "write", client.put_object, Bucket=bucket, Key=key, Body=data, **extra)
    except ClientError as err:
        if if_absent and str(err.response.get("Error", {}).get("Code", "")) in ("412", "PreconditionFailed",
                                                                                   "409", "ConditionalRequestConflict"):
            return False
        raise
    return True


def list_sizes(location: str) -> dict[str, int]:
    """Every file under a directory location: relative name -> bytes (paginated listing)."""
    return {name: size for name, (size, _) in list_objects(location).items()}


def list_objects(location: str) -> dict[str, tuple[int, float]]:
    """Every file under a directory location: relative name -> ``(bytes, last modified)``, the time in unix
    seconds as the store assigned it (S3's ``LastModified``, which no client can set; a local file's
    mtime). One paginated listing."""
    if not is_uri(location):
        root = Path(location.removeprefix("file://"))
        return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime)
                for p in sorted(root.rglob("*")) if p.is_file()}
    bucket, key = split(location)
    head = key.rstrip("/") + "/"
    if on_gcs(location):
        return gcs.list_objects(location, bucket, head)
    client = client_for(location)
    out: dict[str, tuple[int, float]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=head)
    for page in _call(location, "list", lambda: list(pages)):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(head):]] = (obj["Size"], obj["LastModified"].timestamp())
    return out


def upload_dir(local_dir: Path, location: str, names: Iterable[str] | None = None,
               settings: StorageSettings | None = None) -> int:
    """Copy the files of ``local_dir`` (or only ``names``) under ``location``; returns bytes sent.

    Multipart above the threshold and parallel files (:func:`tidal.storage.s3.transfer_config`).
    """
    rels = sorted(names) if names is not None else sorted(
        p.relative_to(local_dir).as_posix() for p in local_dir.rglob("*") if p.is_file())
    if not is_uri(location):
        target = Path(location.removeprefix("file://"))
        for rel in rels:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local_dir / rel, target / rel)
        return sum((local_dir / r).stat().st_size for r in rels)

    bucket, key = split(location)
    if on_gcs(location):
        gcs.upload_files(location, bucket, {f"{key.rstrip('/')}/{rel}": local_dir / rel for rel in rels},
                         settings or StorageSettings())
        return sum((local_dir / r).stat().st_size for r in rels)
    client, config = client_for(location), transfer_config(settings or StorageSettings())

    def put(rel: str) -> None:
        _call(location, "upload", client.upload_file, str(local_dir / rel), bucket, f"{key.rstrip('/')}/{rel}",
              Config=config)

    with ThreadPoolExecutor(max_workers=(settings or StorageSettings()).max_concurrency) as pool:
        list(pool.map(put, rels))
    return sum((local_dir / r).stat().st_size for r in rels)


def download_dir(location: str, local_dir: Path, names: Iterable[str]) -> int:
    """Copy ``names`` under ``location`` into ``local_dir``; returns bytes fetched."""
    total = 0
    for rel in sorted(names):
        path = local_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_bytes(join(location, rel))
        path.write_bytes(data)
        total += len(data)
    return total


def copy_dir(source: str, location: str, names: Iterable[str], settings: StorageSettings | None = None) -> None:
    """Copy the objects ``names`` under ``source`` to the same names under ``location``, inside the store:
    a server-side copy (S3 ``CopyObject``, through boto3's managed copy: multipart above the threshold),
    so no byte passes through this process; two local directories copy file by file.

    Raises:
        FileNotFoundError / StorageUnreachable: as :func:`read_bytes`; StorageError: the two locations are
            not in the same kind of store.
    """
    rels = sorted(names)
    if not is_uri(source) or not is_uri(location):
        if is_uri(source) or is_uri(location):
            raise StorageError(f"cannot copy {source} to {location}: one is a bucket, the other a local path")
        for rel in rels:
            target = Path(location.removeprefix("file://")) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(source.removeprefix("file://")) / rel, target)
        return
    (src_bucket, src_key), (bucket, key) = split(source), split(location)
    if on_gcs(source) != on_gcs(location):
        raise StorageError(f"cannot copy {source} to {location} inside the store: they are in different stores")
    if on_gcs(location):
        gcs.copy_objects(location, [(src_bucket, f"{src_key.rstrip('/')}/{rel}", bucket, f"{key.rstrip('/')}/{rel}")
                                    for rel in rels], settings or StorageSettings())
        return
    client, config = client_for(location), transfer_config(settings or StorageSettings())

    def copy(rel: str) -> None:
        _call(location, "copy", client.copy, {"Bucket": src_bucket, "Key": f"{src_key.rstrip('/')}/{rel}"},
              bucket, f"{key.rstrip('/')}/{rel}", Config=config)

    with ThreadPoolExecutor(max_workers=(settings or StorageSettings()).max_concurrency) as pool:
        list(pool.map(copy, rels))


def delete_dir(location: str) -> None:
    """Remove everything under a directory location (missing is fine)."""
    if not is_uri(location):
        shutil.rmtree(Path(location.removeprefix("file://")), ignore_errors=True)
        return
    bucket, key = split(location)
    keys = [f"{key.rstrip('/')}/{rel}" for rel in list_sizes(location)]
    if on_gcs(location):
        gcs.delete_keys(location, bucket, keys, StorageSettings())
        return
    client = client_for(location)
    for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
        batch = [{"Key": k} for k in keys[start:start + 1000]]
        _call(location, "delete", client.delete_objects, Bucket=bucket, Delete={"Objects": batch, "Quiet": True})


def delete_object(location: str) -> None:
    """Remove one object or file (missing is fine)."""
    if not is_uri(location):
        Path(location.removeprefix("file://")).unlink(missing_ok=True)
        return
    bucket, key = split(location)
    if on_gcs(location):
        gcs.delete_keys(location, bucket, [key], StorageSettings())
        return
    client = client_for(location)
    _call(location, "delete", client.delete_object, Bucket=bucket, Key=key)
