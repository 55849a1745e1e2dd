"""The storage root: a local directory or an object store, behind one :class:`Storage` protocol.

``base`` holds the protocol, the settings and the local directory; ``s3`` the object store
(boto3); ``lease`` the per-step leases that keep two workers from computing one step; ``layout``
the step contract's file names and the atomic write (no tidal import: the bottom layer). Open a
root with :func:`open_storage`; everything else imports the names re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from tidal.storage.base import (
    FAILED,
    SCRATCH,
    SUCCESS,
    LocalStorage,
    Storage,
    StorageError,
    StorageSettings,
)

__all__ = ["FAILED", "SCRATCH", "SUCCESS", "LocalStorage", "Storage", "StorageError", "StorageSettings",
           "open_storage"]


def open_storage(uri: str, base: Path | None = None, settings: StorageSettings | None = None) -> Storage:
    """Open a storage root: ``s3://bucket/prefix`` / ``gs://bucket/prefix`` (boto3) or a local path.

    Relative local paths resolve against ``base`` (default: the cwd).

    Raises:
        StorageError: an unsupported scheme, or a malformed bucket URI. ``gs://`` is GCS through its
            S3-interoperable endpoint with HMAC keys (:func:`tidal.storage.s3.scheme_settings`).
    """
    settings = settings or StorageSettings()
    if uri.startswith(("s3://", "gs://")):
        from tidal.storage.s3 import S3Storage

        return S3Storage.from_uri(uri, settings)
    return LocalStorage.from_uri(uri, base, settings)
