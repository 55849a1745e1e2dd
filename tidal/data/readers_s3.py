"""S3 objects of a file source (``path: s3://bucket/prefix``): listed, then downloaded one at a
time and read like local files (:mod:`tidal.data.readers` module docstring)."""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tidal.data.record_fields import FieldSpec
from tidal.data.sources import ref_sort_key


def list_s3(client, uri: str) -> tuple[str, list[tuple[str, str]]]:
    """``(bucket, [(relative name, key)])`` of an ``s3://`` object or prefix, in ref order.

    An exact object key is one file (its relative name is its base name); otherwise the keys
    under ``prefix/`` are listed with paginated ``ListObjectsV2``.

    Raises:
        FileNotFoundError: when nothing is there.
    """
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{uri}: no bucket in the s3:// URI")
    entries: list[tuple[str, str]] = []
    if prefix and not prefix.endswith("/"):
        try:
            client.head_object(Bucket=bucket, Key=prefix)
            entries = [(posixpath.basename(prefix), prefix)]
        except client.exceptions.ClientError:
            prefix += "/"
    if not entries:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel and not rel.endswith("/") and not any(part.startswith(".") for part in rel.split("/")):
                    entries.append((rel, obj["Key"]))
    if not entries:
        raise FileNotFoundError(f"source path {uri} has no object")
    return bucket, sorted(entries, key=lambda item: ref_sort_key(item[0] + ":"))


def read_s3(fmt: str, uri: str, spec: FieldSpec, skipped: Counter, digests: list[tuple[str, str, int]] | None,
            read_file: Callable[..., Iterator[Any]]) -> Iterator[Any]:
    """Records of the objects under ``uri`` (module docstring), one download at a time, each read
    by ``read_file(fmt, local copy, relative name, spec, skipped, digests)``
    (:func:`tidal.data.readers.read_file`, passed in: this module does not import the readers)."""
    import tempfile

    from tidal.storage import StorageSettings
    from tidal.storage.s3 import s3_client

    client = s3_client(StorageSettings())
    bucket, entries = list_s3(client, uri)
    with tempfile.TemporaryDirectory(prefix="tidal-read-") as tmp:
        for rel, key in entries:
            local = Path(tmp) / posixpath.basename(rel)  # keeps the extension (.gz, .zst, .parquet)
            client.download_file(bucket, key, str(local))
            try:  # the temporary copy is ours; read_file's change check is a formality here
                yield from read_file(fmt, local, rel, spec, skipped, digests)
            finally:
                local.unlink()
